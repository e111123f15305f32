"""A killed ``allocator run``'s holding ends in history, once, written by the host's agent.

``run`` killed with SIGKILL writes no end: its lease expires and the store
deletes the assignment. The agent watching the host sees it vanish and
appends an ``expired`` entry with the GPU-seconds held, which ``usage``
counts; a ``run`` that exits normally keeps its own ``release`` as the only
end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.store import open_store
from allocator.util.times import parse_time
from tests.e2e.agent_harness import HOST, AgentHarness
from tests.support.waiting import wait_for

ENDS = ("release", "expired")


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    with AgentHarness(tmp_path, store_url, prefix).running() as harness:
        yield harness


@pytest.fixture
def runs() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _run(world: AgentHarness, runs: list[subprocess.Popen[bytes]], *words: str) -> Any:
    proc = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", f"host={HOST}", "ttl=2s", *words],
        env=world.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs.append(proc)
    return proc


def _entries(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    entries: list[dict[str, Any]] = json.loads(result.out)["entries"]
    return entries


def _ends(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    return [e for e in _entries(world, job) if e["action"] in ENDS]


def _held_until_gone(world: AgentHarness, job: str) -> float:
    """Poll the store until ``job``'s assignment is gone; the wall time it was first seen so."""
    store = open_store(world.store_url)
    key = world.layout.assignment(HOST, job)
    try:
        wait_for(f"{job} to be held", lambda: store.get(key) is not None)
        return wait_for(
            f"{job}'s lease to expire",
            lambda: time.time() if store.get(key) is None else None,
            timeout=20,
        )
    finally:
        store.close()


def _kill_and_time(world: AgentHarness, runs: list[subprocess.Popen[bytes]], job: str) -> float:
    """Start ``run`` for ``job`` on GPU 1, SIGKILL it; seconds from its start to its GPUs' end."""
    proc = _run(world, runs, f"job={job}", "gpus=1", "--", "sleep", "60")
    store = open_store(world.store_url)
    try:
        wait_for(f"{job} to be held", lambda: store.get(world.layout.assignment(HOST, job)))
    finally:
        store.close()
    proc.kill()
    proc.wait(10)
    gone = _held_until_gone(world, job)
    (start,) = [e for e in _entries(world, job) if e["action"] == "set"]
    started = parse_time(start["at"])
    assert started is not None
    return gone - started.timestamp()


def test_a_killed_runs_holding_ends_once_with_the_gpu_seconds_it_held(
    world: AgentHarness, runs: list[subprocess.Popen[bytes]]
) -> None:
    held = _kill_and_time(world, runs, "doomed")
    (end,) = wait_for("the agent's end entry", lambda: _ends(world, "doomed"))
    assert end["action"] == "expired" and end["by"] == f"agent@{HOST}", end
    assert end["reason"] == "the holding process is gone; its lease expired"
    # History's times are whole seconds: the start and the end may each be off by one.
    assert abs(end["ended"]["gpu_seconds"] - held) <= 2, (end, held)
    assert end["ended"]["exit_status"] is None
    usage = world.cli("usage", "--by", "job", "-o", "json")
    assert usage.code == 0, usage.err
    report = json.loads(usage.out)
    (row,) = [r for r in report["rows"] if r["key"] == "doomed"]
    assert abs(row["gpu_hours"] * 3600 - held) <= 2, (row, held)
    assert report["unended"] == 0
    assert len(_ends(world, "doomed")) == 1


def test_a_run_that_exits_keeps_its_own_release_as_the_only_end(
    world: AgentHarness, runs: list[subprocess.Popen[bytes]]
) -> None:
    finished = _run(world, runs, "job=finished", "gpus=0", "--", "sleep", "1")
    assert finished.wait(30) == 0
    # The agent handles vanished holdings in order: once the killed run's end is
    # written, its look at the finished one is done too.
    _kill_and_time(world, runs, "doomed")
    wait_for("the killed run's end entry", lambda: _ends(world, "doomed"))
    (end,) = _ends(world, "finished")
    assert end["action"] == "release" and end["ended"]["exit_status"] == 0, end
