"""A worker is its whole process tree, whatever session its processes move to.

torchrun starts its ranks with ``start_new_session=True``, and daemonising
helpers call ``setsid()``: such a process is in no process group of the
worker's, yet it holds the worker's GPU. These tests run each case twice:
with a cgroup per worker (where the kernel lets the agent make one) and by
ancestry alone (the shim is the tree's subreaper).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from allocator.agent.kernel.cgroups import cgroup_members, worker_cgroup_base
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import DesiredJob, Start, Stop
from tests.support import supervision
from tests.support.supervision import Harness, alive, exists, job_spec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
make_harness = supervision.make_harness

#: A worker whose child moves to a session of its own and ignores SIGTERM.
ESCAPING = ("--spawn-child", "--setsid-child", "--stubborn-child")
#: The shim's own grace (its backstop when no agent is left): long, so that in
#: these tests only the agent's clock decides when SIGKILL comes.
LONG_GRACE = 60.0


@pytest.fixture(params=["cgroup", "ancestry"])
def tracked(request: pytest.FixtureRequest, make_harness: Callable[..., Harness]) -> Harness:
    """A harness tracking trees by cgroup, or by ancestry alone."""
    if request.param == "cgroup" and worker_cgroup_base()[0] is None:
        pytest.skip("this machine does not let the agent create cgroups")
    return make_harness(cgroups=request.param == "cgroup")


def _start(h: Harness, spec: DesiredJob) -> tuple[dict[str, object], dict[str, object]]:
    h.sup.apply(Start(spec.job, spec, "new"))
    main = h.wait_report(spec.job)
    child = h.report(spec.job, suffix=".child")
    assert child is not None
    return main, child


def test_a_descendant_that_left_the_session_goes_when_its_worker_is_stopped(
    tracked: Harness,
) -> None:
    h = tracked
    main, child = _start(h, job_spec(h.tmp, args=ESCAPING, grace=LONG_GRACE))
    assert child["sid"] == child["pgid"] == child["pid"] != main["sid"]  # it left
    h.sup.apply(Stop("train", "assignment released", 0.5))
    h.until(lambda: h.sup.views()["train"].exit_codes == (143,), "the main process to stop")
    assert alive(int(child["pid"]))  # it ignores SIGTERM ...
    assert h.sup.views()["train"].alive == 1  # ... so the worker still holds its GPU
    h.clock.advance(0.6)
    h.until(lambda: h.sup.views()["train"].alive == 0, "the whole tree to be gone")
    for pid in (child["pid"], main["pid"], main["ppid"]):
        assert not exists(int(pid))  # gone and reaped: no zombie left anywhere
    assert [(e.exit_code, e.crash) for e in h.exits] == [(143, False)]


def test_a_gpu_is_not_handed_on_until_every_process_of_the_tree_is_gone(
    tracked: Harness,
) -> None:
    h = tracked
    desired = {"a": job_spec(h.tmp, "a", args=ESCAPING, gpus=(0,), grace=LONG_GRACE)}
    for action in plan(desired, h.sup.views(), h.clock()):
        h.sup.apply(action)
    _, child = h.wait_report("a"), h.report("a", suffix=".child")
    assert child is not None
    desired = {"b": job_spec(h.tmp, "b", gpus=(0,))}  # a released, b set on the same GPU

    def step() -> list[object]:
        actions = plan(desired, h.sup.views(), h.clock())
        for action in actions:
            h.sup.apply(action)
        h.tick()
        return [a for a in actions if isinstance(a, Start)]

    def main_ended_while_b_waits() -> bool:
        assert step() == []  # a's escaped child still runs on GPU 0: b must wait
        return h.sup.views()["a"].exit_codes == (143,)

    h.until(main_ended_while_b_waits, "a's main process to end")
    assert alive(int(child["pid"]))
    assert step() == []
    assert h.report("b") is None
    h.clock.advance(LONG_GRACE + 1)
    started = h.until(step, "b to start once a is entirely gone")
    assert [s.job for s in started] == ["b"]  # type: ignore[attr-defined]
    assert not exists(int(child["pid"]))


def test_what_a_worker_leaves_behind_when_it_exits_goes_too(tracked: Harness) -> None:
    h = tracked
    args = ("--spawn-child", "--setsid-child", "--exit-after", "0")
    main, child = _start(h, job_spec(h.tmp, args=args, grace=LONG_GRACE))
    h.until(lambda: h.sup.views()["train"].alive == 0, "the worker and its helper to go")
    assert not exists(int(child["pid"])) and not exists(int(main["pid"]))
    assert [(e.exit_code, e.crash) for e in h.exits] == [(0, False)]
    assert h.sup.records()["train"]["state"] == "exited"


def test_a_worker_whose_shim_is_killed_outright_dies_with_it(tracked: Harness) -> None:
    h = tracked
    h.sup.apply(Start("train", job_spec(h.tmp, grace=LONG_GRACE), "new"))
    main = h.wait_report("train")
    os.kill(int(main["ppid"]), signal.SIGKILL)  # its shim, and only its shim
    h.until(lambda: h.sup.views()["train"].exit_codes[0] is not None, "the worker to go")
    # The parent-death signal takes it along: sent as the shim dies, it may land
    # a moment after the agent has reaped the shim on a loaded machine.
    h.until(lambda: not alive(int(main["pid"])), "the parent-death signal to end the worker")
    assert [(e.exit_code, e.crash) for e in h.exits] == [(137, True)]


def test_with_a_cgroup_nothing_escapes_even_a_shim_killed_outright(
    make_harness: Callable[..., Harness],
) -> None:
    base, why = worker_cgroup_base()
    if base is None:
        pytest.skip(f"no cgroups here: {why}")
    h = make_harness(cgroups=True)
    main, child = _start(h, job_spec(h.tmp, args=ESCAPING, grace=LONG_GRACE))
    state = json.loads((h.tmp / "state.json").read_text())
    cgroup = Path(state["jobs"]["train"]["workers"][0]["cgroup"])
    assert {main["pid"], child["pid"], main["ppid"]} <= set(cgroup_members(cgroup))
    os.kill(int(main["ppid"]), signal.SIGKILL)  # the shim: its escaped helper is orphaned
    h.until(lambda: h.sup.views()["train"].exit_codes[0] is not None, "the worker to go")
    assert alive(int(child["pid"]))
    assert h.sup.views()["train"].alive == 1  # the cgroup still holds the orphan
    h.sup.apply(Stop("train", "worker crashed", 0.5))
    h.clock.advance(1.0)
    h.until(lambda: h.sup.views()["train"].alive == 0, "the orphan to be killed")
    assert not exists(int(child["pid"]))  # killed, and reaped by the agent (its subreaper)
    assert not cgroup.exists()  # an empty worker cgroup is removed


def test_where_no_cgroup_can_be_made_the_agent_says_why(tmp_path: Path) -> None:
    """It then tracks trees by ancestry alone (the ``ancestry`` cases above)."""
    own = tmp_path / "cgroup"
    own.write_text("0::/\n")
    no_cgroup2 = tmp_path / "mountinfo"
    no_cgroup2.write_text("22 1 0:21 / /proc rw,nosuid - proc proc rw\n")
    assert worker_cgroup_base(no_cgroup2, own) == (None, "no cgroup2 file system is mounted")
    blocked = tmp_path / "a-file"  # as a read-only /sys/fs/cgroup in a container refuses
    blocked.write_text("")
    mounted = tmp_path / "mountinfo2"
    mounted.write_text(f"30 1 0:26 / {blocked} rw,nosuid - cgroup2 cgroup2 rw\n")
    base, why = worker_cgroup_base(mounted, own)
    assert base is None and why.startswith(f"cannot create cgroups under {blocked}")
    v1_only = tmp_path / "cgroup-v1"
    v1_only.write_text("4:memory:/x\n")
    assert worker_cgroup_base(mounted, v1_only) == (None, "this process is in no cgroup2 group")


def test_agents_sharing_a_cgroup_never_sweep_each_others_worker_cgroups(tmp_path: Path) -> None:
    """Two agents on one machine (or two test processes): each sweeps only its own."""
    from allocator.agent.kernel.cgroups import agent_scope, create_worker_cgroup, remove_cgroup
    from allocator.agent.processes.supervisor import Supervisor

    mine, why = worker_cgroup_base(scope=agent_scope(tmp_path / "a"))
    if mine is None:
        pytest.skip(f"no cgroups here: {why}")
    fresh = create_worker_cgroup(mine, "train.0")  # made, its shim not moved in yet
    assert fresh is not None
    try:
        other = Supervisor(tmp_path / "b" / "logs", tmp_path / "b" / "workers.json")
        assert other.cgroup_base is not None and other.cgroup_base != mine
        other.adopt()  # sweeps what its own state file does not name
        assert fresh.exists()
    finally:
        remove_cgroup(fresh)
        remove_cgroup(mine)
