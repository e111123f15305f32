"""Unassigned GPU use: whose process is whose (real process trees), and what gets reported."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from allocator.agent.gpu_care.unassigned_use import (
    TreeRoot,
    describe_process,
    find_owners,
    steady_memory,
    unassigned_processes,
)
from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import worker_cgroup_base
from allocator.agent.planning.types import Start
from allocator.gpus.usage import GpuUsage, ProcessOnGpu
from allocator.records.types import GpuProcess
from tests.support import supervision
from tests.support.supervision import Harness, job_spec
from tests.support.waiting import wait_for

make_harness = supervision.make_harness
ESCAPING = ("--spawn-child", "--setsid-child")


@pytest.fixture(params=["cgroup", "ancestry"])
def tracked(request: pytest.FixtureRequest, make_harness: Callable[..., Harness]) -> Harness:
    """A harness tracking trees by cgroup, or by ancestry alone."""
    if request.param == "cgroup" and worker_cgroup_base()[0] is None:
        pytest.skip("this machine does not let the agent create cgroups")
    return make_harness(cgroups=request.param == "cgroup")


def _roots(h: Harness) -> dict[str, list[TreeRoot]]:
    return {job: [TreeRoot(*r) for r in roots] for job, roots in h.sup.process_roots().items()}


def test_a_process_that_left_the_workers_session_is_still_the_jobs(
    tracked: Harness, stranger: subprocess.Popen[bytes]
) -> None:
    h = tracked
    h.sup.apply(Start("train", job_spec(h.tmp, args=ESCAPING), "new"))
    main = h.wait_report("train")
    child = h.report("train", suffix=".child")
    assert child is not None and child["sid"] != main["sid"]
    pids = {int(main["pid"]), int(child["pid"]), stranger.pid}
    assert find_owners(pids, _roots(h)) == {int(main["pid"]): "train", int(child["pid"]): "train"}


def test_a_root_whose_pid_now_names_another_process_owns_nothing(
    stranger: subprocess.Popen[bytes],
) -> None:
    stat = procs.read_stat(os.getpid())
    assert stat is not None
    mine = {"train": [TreeRoot(os.getpid(), stat.start_ticks)]}
    assert find_owners({stranger.pid}, mine) == {stranger.pid: "train"}  # my child
    reused = {"train": [TreeRoot(os.getpid(), stat.start_ticks + 1)]}
    assert find_owners({stranger.pid}, reused) == {}


def test_a_visible_process_is_described_by_its_user_and_command(
    stranger: subprocess.Popen[bytes],
) -> None:
    # Polled: under load the child may not have its command line yet when Popen returns.
    def described() -> tuple[str, str] | None:
        found = describe_process(stranger.pid)
        return found if "signal.pause" in found[1] else None

    user, command = wait_for("the stranger's command line", described)
    assert user == getpass.getuser()
    assert command.startswith(sys.executable)


def test_a_process_the_agent_cannot_see_is_reported_without_user_or_command() -> None:
    assert describe_process(2**22 + 12345) == ("", "")  # beyond pid_max: another namespace's


USAGE = (
    GpuUsage(0, 0, processes=(ProcessOnGpu(100, 5000), ProcessOnGpu(200, 300))),
    GpuUsage(1, 0, processes=(ProcessOnGpu(100, 700), ProcessOnGpu(300, None))),
)


def _describe(pid: int) -> tuple[str, str]:
    return f"user{pid}", f"cmd {pid}"


def test_only_processes_on_gpus_their_job_was_not_given_are_unassigned() -> None:
    owners = {100: "train", 200: "eval"}
    found = unassigned_processes(USAGE, {"train": (0, 1), "eval": (1,)}, owners, _describe)
    assert found == (
        GpuProcess(
            gpu=0, pid=200, user="user200", command="cmd 200", memory_used_mib=300, job="eval"
        ),
        GpuProcess(gpu=1, pid=300, user="user300", command="cmd 300", memory_used_mib=None),
    )


def test_the_agents_own_process_is_never_reported() -> None:
    usage = (GpuUsage(0, 0, processes=(ProcessOnGpu(os.getpid(), 10),)),)
    assert unassigned_processes(usage, {}, {}, _describe) == ()


def test_small_memory_moves_keep_the_published_value_so_the_record_stays_put() -> None:
    before = (GpuProcess(gpu=1, pid=300, memory_used_mib=10_000),)
    little = (GpuProcess(gpu=1, pid=300, memory_used_mib=11_000),)
    much = (GpuProcess(gpu=1, pid=300, memory_used_mib=20_000),)
    new = (GpuProcess(gpu=0, pid=301, memory_used_mib=5),)
    assert steady_memory(before, little) == before
    assert steady_memory(before, much) == much
    assert steady_memory(before, new) == new
