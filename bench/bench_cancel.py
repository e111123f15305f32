"""A cancel of a running job, to its GPU free of its worker.

Job ``qa`` holds GPU 7 with its worker running under the agent; the cancel
(the same recipe ``allocator cancel`` runs: the choice, then the release
with ``cancelled by``) commits in this process. Timed from the commit to the
worker's process being gone: the agent sees the release and stops the
worker (SIGTERM; its grace is 1 s, the dummy worker exits at once).
Baseline, interleaved: a propagation move of :mod:`bench.bench_agent` (a
``set`` to the moved worker reporting), whose first half, the agent seeing
the change and stopping a worker, a cancel repeats; so the target is 1.5x.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from allocator.control.client import Allocator
from allocator.control.owners import may_change
from allocator.recipes.cancel import choose, pending_entries
from allocator.store import open_store
from bench.common import Row, ratio_row
from tests.e2e.agent_harness import AgentHarness, pid_alive

__all__ = ["cancel_to_free"]

GPU = 7


def cancel_to_free(
    world: AgentHarness,
    rounds: int,
    backend: str,
    move: Callable[[], float],
    wait_worker: Callable[[Path, int | None], int],
) -> Row:
    """``rounds`` cancels interleaved with propagation moves; one row (median)."""
    store = open_store(world.store_url)
    client = Allocator(store, prefix=world.prefix)
    ours: list[float] = []
    floor: list[float] = []
    try:
        for _ in range(rounds):
            (world.workdir / "qa.json").unlink(missing_ok=True)
            assert world.cli("set", "job=qa", f"gpus={GPU}").code == 0
            pid = wait_worker(world.workdir / "qa.json", None)
            _cancel(client, "qa")
            cancelled = time.monotonic()
            _until_gone(pid)
            ours.append(time.monotonic() - cancelled)
            floor.append(move())
    finally:
        store.close()
    return ratio_row(f"cancel -> GPUs free, {backend}, median", ours, floor, most=1.5)


def _cancel(client: Allocator, job: str) -> None:
    """What ``allocator cancel job=JOB`` does to a running job."""
    snapshot = client.require_policy()
    held = list(client.host("node1").assignments.values())
    chosen = choose(
        pending_entries(client, None),
        held,
        job,
        client.holder,
        lambda holder: may_change(snapshot.policy, client.holder, (), holder),
    )
    for assignment in chosen.running:
        client.release(assignment.host, assignment.job, reason=f"cancelled by {client.holder}")


def _until_gone(pid: int, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.001)
    raise SystemExit(f"the cancelled job's worker {pid} still runs after {deadline_s} s")
