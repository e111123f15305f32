"""Which GPUs of a new holding another holding's workers still run on (pure).

A holding ends only when nothing of it is left: the store may already say
the GPUs are free (a release went through while the host's agent was slow
to stop the old job's worker, or could not hear of the release at all),
yet the old worker still runs there. A process that starts a holding's
command itself (``allocator run``, ``lease()``) waits until these
blockers are gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from allocator.records.types import WorkerRecord

__all__ = ["ACTIVE_STATES", "blockers", "describe_blockers"]

#: Worker states whose processes may still be on their GPUs.
ACTIVE_STATES = frozenset({"running", "starting", "stopping"})


def blockers(
    job: str,
    gpus: Iterable[int],
    workers: Iterable[WorkerRecord],
    held: Mapping[str, tuple[int, ...]],
) -> dict[str, tuple[int, ...]]:
    """Per other job: the GPUs of ``gpus`` its worker still runs on though it no longer holds them.

    ``held``: each job's GPUs in its current assignment on this host. A job
    still holding a GPU shares it legitimately (the holding's transaction
    allowed it), so only GPUs a worker names beyond its job's holding block.
    """
    wanted = set(gpus)
    found: dict[str, tuple[int, ...]] = {}
    for worker in workers:
        if worker.job == job or worker.state not in ACTIVE_STATES or worker.device == "cpu":
            continue
        stale = (set(worker.gpus) - set(held.get(worker.job, ()))) & wanted
        if stale:
            found[worker.job] = tuple(sorted(stale))
    return found


def describe_blockers(found: Mapping[str, tuple[int, ...]]) -> str:
    """``train's worker on GPU 0``, joined with "and" (pure)."""
    parts = []
    for job, gpus in sorted(found.items()):
        noun = "GPU" if len(gpus) == 1 else "GPUs"
        parts.append(f"{job}'s worker on {noun} {','.join(map(str, gpus))}")
    return " and ".join(parts)
