"""The end of an ``allocator run`` holding nobody was left to record (pure).

``allocator run`` (and ``allocator.lease()``) holds its assignment under a
store lease and writes the holding's end itself when it exits. Killed with
SIGKILL, it writes nothing: the store deletes the assignment when the lease
runs out. The host's agent sees the assignment vanish, and records an
``expired`` entry ending the holding when it saw it go, so ``allocator
usage`` counts the time it really held.

Never twice: a ``run`` that released normally wrote a ``release`` entry in
the transaction that deleted the assignment, so by the time the agent sees
the assignment gone, that entry is in the host's history. The store link
checks for such an end (:func:`ended_after`) right before appending, in the
same head-comparing transaction an append always is; a release written
meanwhile moves the head, the append fails its compare, and the check runs
again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from allocator.agent.sync.history_decisions import agent_actor
from allocator.history.entries import ended_fields
from allocator.history.stream import Stored
from allocator.records.holding import submitted_words
from allocator.records.types import Assignment, HistoryEntry, RunHolder
from allocator.util.times import format_time, parse_time

__all__ = ["ENDS", "EXPIRED_REASON", "ended_after", "expiry_entry", "vanished_runs"]

#: Entries after which a holding of the job on the host is over (or another began).
ENDS = frozenset({"release", "set", "move", "expired"})
EXPIRED_REASON = "the holding process is gone; its lease expired"


def vanished_runs(
    before: Mapping[str, Assignment],
    before_revisions: Mapping[str, int],
    after: Mapping[str, Assignment],
) -> list[tuple[Assignment, int]]:
    """Assignments held by ``allocator run`` in ``before`` and gone in ``after``, with revisions."""
    return [
        (held, before_revisions.get(job, 0))
        for job, held in sorted(before.items())
        if held.run is not None and job not in after
    ]


def expiry_entry(held: Assignment, host: str, seen_gone: datetime) -> HistoryEntry:
    """The ``expired`` entry ending ``held``'s holding when the agent saw it gone."""
    start = parse_time(held.updated_at)
    seconds = max((seen_gone - start).total_seconds(), 0.0) if start is not None else 0.0
    gpus = len(held.gpus) if held.mode == "gpu" else 0
    assert held.run is not None  # only run-held assignments expire this way
    return HistoryEntry(
        seq=0,
        at=format_time(seen_gone),
        by=agent_actor(host),
        action="expired",
        host=host,
        job=held.job,
        from_mode=held.mode,
        from_gpus=tuple(held.gpus),
        reason=EXPIRED_REASON,
        detail=_held_by(held, held.run),
        slots=held.slots if held.mode == "gpu" and held.slots != 1 else None,
        gpu_seconds=round(gpus * seconds, 3),
        holder=held.holder,
        **ended_fields(held),
    )


def _held_by(held: Assignment, process: RunHolder) -> str:
    """Who held it: the ``run`` (or ``lease()``) process, or the agent for a submitted job."""
    if process.launched_by == "submit":
        return submitted_words(held)
    return f"held by allocator {process.launched_by} (pid {process.pid})"


def ended_after(entries: Iterable[Stored], job: str, revision: int) -> bool:
    """Whether ``entries`` (one host's) end ``job``'s holding written at ``revision``."""
    return any(
        stored.revision > revision and stored.entry.job == job and stored.entry.action in ENDS
        for stored in entries
    )
