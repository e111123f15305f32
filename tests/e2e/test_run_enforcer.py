"""The host's agent stops what is left of a holding whose ``run`` was killed with SIGKILL.

The parent-death signal reaches only ``run``'s direct child: behind a
wrapper (``sh -c``) the command's processes would go on using the GPU
after the lease expired. The agent scans its host for every process whose
environment carries the holding's identity and stops it (SIGTERM, a
grace, SIGKILL), and logs it; an agent that was down when the lease
expired does so once it is back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    with AgentHarness(tmp_path, store_url, prefix).running() as harness:
        yield harness


@pytest.fixture
def left() -> Iterator[list[int]]:
    """The pids the killed run's command left: killed after the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kill_wrapped_run(world: AgentHarness, left: list[int]) -> None:
    """``run`` a wrapper that leaves a background and a ``setsid`` child; SIGKILL ``run``."""
    pids = world.workdir / "pids"
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; wait"
    run = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", "job=wrapped", f"host={HOST}", "gpus=1",
         "ttl=1s", "--", "sh", "-c", script],
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for("the command's pids", lambda: pids.exists() and len(pids.read_text().split()) == 2)
        left.extend(int(p) for p in pids.read_text().split())
    finally:
        run.kill()
        run.wait(10)
    store = open_store(world.store_url)
    try:
        key = world.layout.assignment(HOST, "wrapped")
        wait_for("the lease to expire", lambda: store.get(key) is None, timeout=10)
    finally:
        store.close()


def _stopped_by_the_agent(world: AgentHarness, left: list[int]) -> None:
    wait_for("the agent to stop the command", lambda: not any(map(pid_alive, left)), timeout=20)
    (stopped,) = wait_for("the log", lambda: world.events("holding-stopped", job="wrapped"))
    assert sorted(stopped["pids"]) == sorted(left) and stopped["killed"] is False, stopped


def test_a_killed_runs_wrapped_command_is_stopped_when_its_lease_expires(
    world: AgentHarness, left: list[int]
) -> None:
    _kill_wrapped_run(world, left)
    _stopped_by_the_agent(world, left)


def test_an_agent_down_when_the_lease_expired_stops_the_leftovers_once_back(
    world: AgentHarness, left: list[int]
) -> None:
    assert world.stop_agent() == 0
    _kill_wrapped_run(world, left)
    assert all(map(pid_alive, left))
    world.start_agent()
    _stopped_by_the_agent(world, left)


LEASE_CHILD = """
import os, signal, subprocess, sys
import allocator
with allocator.lease(gpus=[2], host=sys.argv[1], job="notebook", ttl=1):
    child = subprocess.Popen(["sleep", "300"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the kernel dies; its child lives on
"""


def test_what_a_killed_lease_holder_started_is_stopped_when_its_lease_expires(
    world: AgentHarness, left: list[int]
) -> None:
    died = subprocess.run([sys.executable, "-c", LEASE_CHILD, HOST], env=world.env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert died.returncode == -signal.SIGKILL, died.stderr
    left.append(int(died.stdout))
    wait_for("the agent to stop the child", lambda: not pid_alive(left[0]), timeout=20)
    (stopped,) = wait_for("the log", lambda: world.events("holding-stopped", job="notebook"))
    assert stopped["pids"] == left, stopped


def test_a_process_that_cleared_its_environment_is_stopped_through_the_runs_cgroup(
    world: AgentHarness, left: list[int]
) -> None:
    from allocator.agent.kernel.cgroups import RUNS_SCOPE, worker_cgroup_base

    if worker_cgroup_base(scope=RUNS_SCOPE)[0] is None:
        pytest.skip("this host lets no process create a cgroup")
    pids = world.workdir / "pids"
    script = f"sleep 300 & echo $! >> {pids}; env -i sleep 300 & echo $! >> {pids}; wait"
    run = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", "job=wrapped", f"host={HOST}", "gpus=1",
         "ttl=1s", "--", "sh", "-c", script],
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for("the command's pids", lambda: pids.exists() and len(pids.read_text().split()) == 2)
        left.extend(int(p) for p in pids.read_text().split())
    finally:
        run.kill()
        run.wait(10)
    _stopped_by_the_agent(world, left)
