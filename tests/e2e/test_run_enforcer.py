"""The host's agent stops what is left of a holding whose ``run`` was killed with SIGKILL.

The parent-death signal reaches only ``run``'s direct child: behind a
wrapper (``sh -c``) the command's processes would go on using the GPU
after the lease expired. The agent scans its host for every process whose
environment carries the holding's identity and stops it (SIGTERM, a
grace, SIGKILL), and logs it.
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


def test_a_killed_runs_wrapped_command_is_stopped_when_its_lease_expires(
    world: AgentHarness, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; wait"
    run = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", "job=wrapped", f"host={HOST}", "gpus=1",
         "ttl=1s", "--", "sh", "-c", script],
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    left: list[int] = []
    try:
        wait_for("the command's pids", lambda: pids.exists() and len(pids.read_text().split()) == 2)
        left = [int(p) for p in pids.read_text().split()]
        run.kill()
        run.wait(10)
        store = open_store(world.store_url)
        try:
            key = world.layout.assignment(HOST, "wrapped")
            wait_for("the lease to expire", lambda: store.get(key) is None, timeout=10)
        finally:
            store.close()
        wait_for("the agent to stop the command", lambda: not any(map(pid_alive, left)))
        (stopped,) = wait_for("the log", lambda: world.events("holding-stopped", job="wrapped"))
        assert sorted(stopped["pids"]) == sorted(left), stopped
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
