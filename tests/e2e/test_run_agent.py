"""``allocator run`` next to a real agent: its GPUs are held, its processes are no stranger's.

The agent sees the run's assignment of a job its policy declares, counts the
GPU as held, never starts a worker for it nor stops the run's command, and
does not report the command's process on that GPU as unassigned use (a
stranger's process on another GPU still is).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    try:
        yield harness
    finally:
        harness.cleanup()


def _gpus(world: AgentHarness) -> list[dict[str, object]]:
    result = world.cli("status", "-o", "json")
    assert result.code == 0, result.err
    (host,) = json.loads(result.out)["hosts"]
    gpus: list[dict[str, object]] = host["gpus"]
    return gpus


def test_the_agent_counts_a_runs_gpu_held_and_never_starts_or_stops_it(
    world: AgentHarness, stranger: subprocess.Popen[bytes]
) -> None:
    world.apply_policy()
    world.start_agent()
    pid_file = world.workdir / "command.pid"
    script = (
        f"import os, signal; open({str(pid_file)!r}, 'w').write(str(os.getpid())); signal.pause()"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", "job=train", f"host={HOST}", "gpus=1", "--",
         sys.executable, "-c", script],
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for("the command to start", pid_file.exists)
        command = int(pid_file.read_text())
        world.gpus.update(1, processes=[{"pid": command, "used_memory_mib": 1000}])
        world.gpus.update(3, processes=[{"pid": stranger.pid, "used_memory_mib": 2048}])

        def unassigned() -> list[object] | None:
            return [p["pid"] for g in _gpus(world) for p in g["unassigned"]] or None  # type: ignore[attr-defined]

        assert wait_for("the stranger on GPU 3 to be reported", unassigned) == [stranger.pid]
        assert _gpus(world)[1]["holder"] == "train"
        assert world.events("start", job="train") == [] and world.report("train") is None
        assert pid_alive(command)

        run.send_signal(signal.SIGINT)
        assert run.wait(15) == 128 + signal.SIGINT
        wait_for("the GPU to be free", lambda: _gpus(world)[1]["holder"] is None)
        assert world.events("start", job="train") == [] and world.events("stop", job="train") == []
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
