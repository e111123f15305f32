"""How many of one host's GPUs are free, held, idle, unhealthy and on CPU (pure).

One rule for two callers: ``status --summary`` counting a host from its
records (:mod:`allocator.status.summary_count`), and the host's agent
writing the same numbers to ``counts/<host>`` (:mod:`allocator.records.host_counts`)
so the summary of a fleet need not read every host's records. The inputs
are duck-typed: the summary's slim decodings and the agent's full records
both fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from allocator.records.host_counts import HostCounts
from allocator.util.times import parse_time

__all__ = ["Held", "Worker", "count_host"]


class Held(Protocol):
    """What a count needs of an assignment."""

    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def mode(self) -> str: ...
    @property
    def fallback_reason(self) -> str | None: ...


class Worker(Protocol):
    """What a count needs of a worker record."""

    @property
    def device(self) -> str: ...
    @property
    def fallback_reason(self) -> str | None: ...
    @property
    def idle_since(self) -> str | None: ...


def count_host(
    host: str,
    held: Mapping[str, Held],
    workers: Mapping[str, Worker],
    indices: Iterable[int],
    unhealthy: Mapping[int, str],
) -> HostCounts:
    """``host``'s counts: its GPUs ``indices`` (inventory, or declared) and those held.

    A GPU held by several jobs (shared) counts once; whether it is idle
    follows its first holder by name, as the status rows do.
    """
    holders: dict[int, list[str]] = {}
    fallback = 0
    for job in sorted(held):
        assignment = held[job]
        if assignment.mode != "gpu":
            fallback += bool(assignment.fallback_reason)
            continue
        for gpu in assignment.gpus:
            holders.setdefault(gpu, []).append(job)
    gpus = sorted(set(indices) | set(holders))
    free = held_count = idle = sick = 0
    for gpu in gpus:
        jobs = holders.get(gpu)
        if gpu in unhealthy:
            sick += 1
        elif not jobs:
            free += 1
        if not jobs:
            continue
        held_count += 1
        idle += _idle(workers.get(jobs[0]))
        fallback += any(_on_cpu(held[j], workers.get(j)) for j in jobs)
    return HostCounts(host, tuple(gpus), free, held_count, idle, sick, fallback)


def _idle(worker: Worker | None) -> bool:
    """Whether the status shows an idle time for a job with this worker record."""
    if worker is None or not worker.idle_since:
        return False
    started = parse_time(worker.idle_since)
    return started is not None and started.tzinfo is not None


def _on_cpu(held: Held, worker: Worker | None) -> bool:
    """A job holding GPUs whose workers run on CPU by its fallback rule."""
    return worker is not None and worker.device == "cpu" and bool(worker.fallback_reason)
