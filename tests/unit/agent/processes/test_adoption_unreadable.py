"""An unusable state file is no licence to restart everything; adoption is per boot.

A state file cut short, or written by a newer agent (another
``schema_version``), is refused whole: the restarted agent adopts the live
shims from their own status files (pid, start time, job, fingerprint) and
kills nothing, so no job runs twice and none is restarted while its old copy
is still stopping. A state file or status file written on another boot
(``boot_id``) adopts nothing and signals nothing: its pids are other
processes now. The agent that dies is a supervisor in another process (see
:mod:`tests.support.supervision`); the harness's plays the restarted one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.kernel import procs
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import DesiredJob, Start, Stop
from tests.support import supervision
from tests.support.supervision import DUMMY, Harness, OtherAgent, alive, job_spec, poll

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
make_harness = supervision.make_harness
h = supervision.h
other_agent = supervision.other_agent


def _desired(h: Harness, *jobs: str, fingerprint: str = "") -> dict[str, DesiredJob]:
    return {
        job: replace(job_spec(h.tmp, job), fingerprint=fingerprint or f"fp-{job}") for job in jobs
    }


def _two_jobs_then_kill_9(other_agent: Callable[..., OtherAgent], h: Harness) -> list[int]:
    agent = other_agent({"train": [[], []], "eval": [[]]})
    pids = [h.wait_report(job, index)["pid"] for job, index in (("train", 0), ("train", 1))]
    pids.append(h.wait_report("eval")["pid"])
    agent.kill_9()
    return pids


def _mangle(h: Harness, how: str) -> None:
    path = h.tmp / "state.json"
    if how == "truncated":
        text = path.read_text()
        path.write_text(text[: len(text) // 2])
    else:
        data = json.loads(path.read_text())
        data["schema_version"] = 99  # an upgrade that was rolled back
        path.write_text(json.dumps(data))


@pytest.mark.parametrize("how", ["truncated", "newer"])
def test_an_unusable_state_file_adopts_from_the_status_files_and_kills_nothing(
    h: Harness, other_agent: Callable[..., OtherAgent], how: str
) -> None:
    pids = _two_jobs_then_kill_9(other_agent, h)
    _mangle(h, how)
    report = h.sup.adopt()
    assert report.adopted == ("eval", "train")
    unreadable = [f for name, f in h.events if name == "state-unreadable"]
    assert len(unreadable) == 1
    if how == "newer":
        assert "schema_version 99" in unreadable[0]["error"]
    assert "unknown-worker-stopped" not in h.event_names()
    assert all(alive(pid) for pid in pids)
    assert sorted(h.pids("train") + h.pids("eval")) == sorted(pids)
    # The same specs: nothing to do. Nothing is started a second time.
    assert plan(_desired(h, "train", "eval"), h.sup.views(), h.clock()) == []
    assert h.sup.records()["train"]["state"] == "running"


def test_a_job_adopted_from_status_files_starts_again_only_once_its_old_copy_is_gone(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [["--ignore-sigterm"]]}, grace=0.5)
    old = h.wait_report("train")["pid"]
    agent.kill_9()
    _mangle(h, "truncated")
    assert h.sup.adopt().adopted == ("train",)
    changed = _desired(h, "train", fingerprint="fp-new")
    actions = plan(changed, h.sup.views(), h.clock())
    assert [type(a) for a in actions] == [Stop]
    for action in actions:
        h.sup.apply(action)
    h.tick()
    assert alive(old)  # it ignores SIGTERM: still stopping ...
    assert plan(changed, h.sup.views(), h.clock()) == []  # ... so nothing starts
    h.clock.advance(1.0)  # the grace is over: SIGKILL
    h.until(lambda: h.sup.views()["train"].alive == 0, "the old copy to be gone")
    assert not alive(old)
    actions = plan(changed, h.sup.views(), h.clock())
    assert [(type(a), getattr(a, "cause", None)) for a in actions] == [(Start, "change")]


def test_a_state_file_from_another_boot_adopts_nothing_and_signals_nothing(
    make_harness: Callable[..., Harness], other_agent: Callable[..., OtherAgent]
) -> None:
    """After a reboot a recorded pid (even with matching start ticks) is someone else's."""
    agent = other_agent({"train": [[]]})
    h = make_harness(boot_id="a-later-boot")
    report_pid = h.wait_report("train")["pid"]
    agent.kill_9()
    report = h.sup.adopt()
    assert (report.adopted, report.ended, report.workers) == ((), (), ())
    unreadable = [f for name, f in h.events if name == "state-unreadable"]
    assert "another boot" in unreadable[0]["error"]
    assert "unknown-worker-stopped" not in h.event_names()
    assert alive(report_pid)  # not ours to signal: on a real reboot it is another program
    assert h.sup.views() == {}


def test_a_status_file_from_another_boot_never_gets_its_pid_signalled(h: Harness) -> None:
    stranger = subprocess.Popen(
        [sys.executable, DUMMY, "--out", str(h.tmp / "reports" / "stranger.0.json")],
        start_new_session=True,
    )
    try:
        pid = h.wait_report("stranger")["pid"]
        stat = procs.read_stat(pid)
        assert stat is not None
        status: dict[str, Any] = {
            "shim_pid": pid,  # a recycled pid with the very start ticks recorded
            "shim_start_ticks": stat.start_ticks,
            "state": "running",
            "job": "train",
            "index": "0",
            "boot_id": "an-earlier-boot",
        }
        path = h.tmp / "workers" / "train.0.beef.status"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(status))
        assert h.sup.adopt().adopted == ()
        assert "unknown-worker-stopped" not in h.event_names()
        assert alive(pid)
        poll(lambda: not Path(path).exists(), "the stale status file to be cleared")
    finally:
        stranger.kill()
        stranger.wait(timeout=30)
