"""A submitted job on an idle host, from ``allocator submit`` returning to its command running.

``allocator submit job=sbN gpus=6 host=node1 -- DUMMY --out FILE`` on a host
whose GPU 6 is free: the agent's batch runner sees the new queue entry (its
watch of the host's queue), takes its turn in one transaction and starts the
command, which writes its report. Timed from the submit's return to the
report, as a propagation move is timed from the ``set``'s return to the
moved worker's report; each round's job is then released (the agent stops
it) and gone before the next. Baseline, interleaved: a propagation move of
:mod:`bench.bench_agent`. A take by the agent is a waiter's take (a read of
the queue, one transaction) before the spawn, so the target is 2x.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Row, ratio_row
from tests.e2e.agent_harness import DUMMY, AgentHarness, pid_alive

__all__ = ["submit_to_running"]

GPU = 6


def submit_to_running(
    world: AgentHarness,
    rounds: int,
    backend: str,
    move: Callable[[], float],
    wait_worker: Callable[[Path, int | None], int],
) -> Row:
    """``rounds`` submissions interleaved with propagation moves; one row (median)."""
    ours: list[float] = []
    floor: list[float] = []
    for index in range(rounds):
        job = f"sb{index}"
        out = world.workdir / f"{job}.json"
        command = [sys.executable, str(DUMMY), "--out", str(out)]
        result = world.cli("submit", f"job={job}", f"gpus={GPU}", "host=node1", "--", *command)
        returned = time.monotonic()
        if result.code != 0:
            raise SystemExit(f"allocator submit failed: {result.err}")
        pid = wait_worker(out, None)
        ours.append(time.monotonic() - returned)
        if world.cli("release", f"job={job}").code != 0:
            raise SystemExit(f"allocator release job={job} failed")
        _until_free(world, job, pid)
        floor.append(move())
    return ratio_row(f"submit -> running, {backend}, median", ours, floor, most=2)


def _until_free(world: AgentHarness, job: str, pid: int, deadline_s: float = 30.0) -> None:
    """The job's command is gone and it holds nothing (its GPU free for the next round)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not pid_alive(pid) and world.cli("get", f"job={job}").code == 6:
            return
        time.sleep(0.01)
    raise SystemExit(f"submitted job {job} still runs or holds its GPU after {deadline_s} s")
