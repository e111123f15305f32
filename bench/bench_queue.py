"""The wait queue's hand-off: a release, to the next waiter's worker running.

Two jobs, ``qa`` and ``qb``, take turns on GPU 7 of the agent's host: one
holds it (its worker running under the agent), the other waits for it
(``allocator set job=qb gpus=7 --wait``, its entry in the queue). Timed from
the holder's release (committed in this process) to the waiter's worker
reporting from its first line of Python: the waiter sees the release, takes
the GPU in its own transaction, and the agent starts its worker. Baseline,
interleaved: the propagation floor of :mod:`bench.bench_agent` (a bare
watch seeing a write, then a bare spawn). The hand-off is two such hops (to
the waiter, then to the agent), so the target is three times the floor.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocator.control.client import Allocator
from allocator.store import open_store
from bench.common import Row, ratio_row
from tests.e2e.agent_harness import DUMMY, AgentHarness

__all__ = ["GPU", "handoff", "queue_jobs"]

GPU = 7


def queue_jobs(workdir: Path) -> dict[str, Any]:
    """The two jobs taking turns (added to the agent bench's policy)."""
    return {
        name: {
            "command": [sys.executable, str(DUMMY), "--out", str(workdir / f"{name}.json")],
            "grace_seconds": 1,
        }
        for name in ("qa", "qb")
    }


def handoff(
    world: AgentHarness,
    rounds: int,
    backend: str,
    bare_move: Callable[[], float],
    wait_worker: Callable[[Path, int | None], int],
) -> Row:
    """``rounds`` hand-offs interleaved with bare moves; one row (median)."""
    store = open_store(world.store_url)
    client = Allocator(store, prefix=world.prefix)
    ours: list[float] = []
    floor: list[float] = []
    try:
        assert world.cli("set", "job=qa", f"gpus={GPU}").code == 0
        wait_worker(world.workdir / "qa.json", None)
        for i in range(rounds):
            holder, waiter = ("qa", "qb") if i % 2 == 0 else ("qb", "qa")
            (world.workdir / f"{waiter}.json").unlink(missing_ok=True)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "allocator",
                    "set",
                    f"job={waiter}",
                    f"gpus={GPU}",
                    "--wait",
                ],
                env=world.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _until_queued(client, world.host)
            client.release(world.host, holder)
            released = time.monotonic()
            wait_worker(world.workdir / f"{waiter}.json", None)
            ours.append(time.monotonic() - released)
            if proc.wait(30) != 0:
                raise SystemExit(f"the waiter for {waiter} exited {proc.returncode}")
            floor.append(bare_move())
        client.release(world.host, "qb" if rounds % 2 else "qa")  # GPU 7 free for later rows
    finally:
        store.close()
    return ratio_row(f"queue hand-off, {backend}, median", ours, floor, most=3)


def _until_queued(client: Allocator, host: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if client.store.list(client.layout.host_queue(host)).items:
            return
        time.sleep(0.005)
    raise SystemExit("the waiter never joined the queue")
