"""An agent killed in the middle of handing a worker to its cold shim: nothing runs.

The supervisor in another process is frozen at the ``handover`` pause point
(half of the environment's frame written to the shim's pipe; see
:mod:`allocator.agent.processes.pause_points`), then killed with SIGKILL.
Its shim gets less than a whole frame: it starts nothing and says so in its
status file (exit 122). The restarted supervisor records that exit with the
shim's reason, never adopts a worker that does not exist, and the job's
next start has its whole environment.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import pytest

from allocator.agent.planning.reconcile import plan
from allocator.agent.processes.pause_points import PAUSE_VARIABLE
from allocator.agent.processes.worker_status import read_shim_status
from allocator.agent.shim.main import EXIT_HANDOVER
from tests.e2e.agent_harness import processes_running as shims_running
from tests.support import supervision
from tests.support.supervision import Harness, OtherAgent, job_spec, poll, processes_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
make_harness = supervision.make_harness
h = supervision.h
other_agent = supervision.other_agent


def test_a_shim_whose_agent_died_mid_hand_over_starts_nothing_and_the_job_starts_whole(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [[]]}, env={PAUSE_VARIABLE: "handover"}, ready=False)
    status_dir = h.tmp / "workers"

    def shim_state() -> str | None:
        found = [read_shim_status(p) for p in status_dir.glob("train.*.status")]
        return found[0].state if found and found[0] is not None else None

    def shim_waiting() -> bool:
        # "prepared" is the agent's own status file, written before the shim exists; the
        # shim writes nothing until its frame is whole, so look for the shim process itself.
        return shim_state() == "prepared" and any(shims_running(str(status_dir), shims=True))

    poll(shim_waiting, "the shim to wait for its hand-over")
    out = h.tmp / "reports" / "train.0.json"
    agent.kill_9()
    # The shim writes its refusal, then exits: adopting between the two would rightly
    # find a live shim, so wait for both.
    poll(
        lambda: shim_state() == "failed" and not any(shims_running(str(status_dir), shims=True)),
        "the cut-off shim to say it started nothing and exit",
    )
    report = h.sup.adopt()
    assert report.adopted == ()  # no worker runs: nothing is adopted as healthy
    h.until(lambda: h.exits, "the shim's exit")
    assert [(e.exit_code, e.crash) for e in h.exits] == [(EXIT_HANDOVER, True)]
    assert "incomplete hand-over" in h.exits[0].message
    assert not out.exists() and processes_running(out) == []
    h.until(lambda: h.sup.views()["train"].alive == 0, "the shim to be gone")
    desired = {"train": replace(job_spec(h.tmp), fingerprint="fp-train")}
    for action in plan(desired, h.sup.views(), h.clock()):
        h.sup.apply(action)
    h.clock.advance(60.0)
    for action in plan(desired, h.sup.views(), h.clock()):
        h.sup.apply(action)
    env = h.wait_report("train")["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # the whole environment this time
    assert len(processes_running(out)) == 1
