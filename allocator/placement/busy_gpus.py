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

__all__ = ["ACTIVE_STATES", "blockers", "describe_blockers", "leftovers"]

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


def leftovers(
    gpus: Iterable[int],
    carried: Mapping[str, tuple[int, ...]],
    current: Iterable[str],
    where: tuple[str, str],
) -> dict[str, tuple[int, ...]]:
    """Per job: the GPUs of ``gpus`` a process of one of its ended holdings still runs on.

    ``carried``: holding identity -> the GPUs its processes were given (what
    runs on this host, read from their environment); ``current``: the
    identities of the holdings the store has now (this one's among them);
    ``where``: (key prefix, host), whose identities alone count. A holding's
    command starts only once its assignment is written, so an identity the
    store no longer has belongs to a holding that ended.
    """
    prefix, host = where
    wanted, live = set(gpus), set(current)
    found: dict[str, set[int]] = {}
    for identity, used in carried.items():
        named = identity.rpartition("/")[0]
        if identity in live or not (named.startswith(f"{prefix}:") and named.endswith(f"@{host}")):
            continue
        job = named[len(prefix) + 1 : -len(host) - 1]
        if stale := set(used) & wanted:
            found.setdefault(job, set()).update(stale)
    return {job: tuple(sorted(stale)) for job, stale in found.items()}


def describe_blockers(
    found: Mapping[str, tuple[int, ...]], left: Mapping[str, tuple[int, ...]] | None = None
) -> str:
    """``train's worker on GPU 0``, ``r1's ended holding's processes on GPU 1``, joined (pure)."""
    parts = [f"{job}'s worker on {_gpus(gpus)}" for job, gpus in sorted(found.items())]
    parts += [
        f"{job}'s ended holding's processes on {_gpus(gpus)}"
        for job, gpus in sorted((left or {}).items())
    ]
    return " and ".join(parts)


def _gpus(gpus: tuple[int, ...]) -> str:
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))
