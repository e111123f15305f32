"""GPU-hours held, from history (``allocator usage``, like Slurm's ``sreport``).

A holding begins with a ``set`` entry (or a ``move``: the old one ends, a new
one begins) and ends with the job's next ``move`` or ``release`` on that
host, or the ``expired`` entry the host's agent writes when an ``allocator
run`` killed with SIGKILL lost its assignment by lease expiry. A holding
still open is counted up to now while its assignment still exists; one
whose assignment is gone without an end entry (no agent was watching when
its lease expired) is not counted past its start, and the report says how
many there were. Only the time inside the window (``--since`` .. now)
counts.

History keeps only its newest entries: a holding whose start entry was
trimmed away is still counted, from its assignment's own time while it
holds, else from the oldest entry its host's history kept (it held at
least that long).

Times are the writers' clocks, bounded by the store's order of the
entries: an entry is never earlier than the nearest entry another machine
wrote before it, never later than the nearest one another machine wrote
after it, and never later than the reader's now. So one machine's clock
set an hour off moves its entries only within what the store saw.

Who held it: the assignment's ``holder`` where the entry records one, else
the user part of who wrote it (``alice`` of ``alice@node1``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from allocator.history.rollup import Span, holder_of
from allocator.history.stream import Stored
from allocator.records.types import Assignment, HistoryEntry
from allocator.util.times import parse_time

__all__ = [
    "BY",
    "Holding",
    "Span",
    "UsageRow",
    "holder_of",
    "holdings",
    "open_spans",
    "span_of",
    "store_times",
    "summarize",
    "summarize_spans",
]

#: Entries that end a job's holding on a host (``expired``: the agent saw a killed run's go).
_ENDS = ("set", "move", "release", "expired")
#: What ``--by`` may group by.
BY = ("user", "team", "job", "pool", "host")


@dataclass(frozen=True, slots=True)
class Holding:
    """One stretch of time a job held GPUs on a host, as history recorded it."""

    host: str
    job: str
    holder: str
    gpus: int
    slots: int
    start: datetime
    end: datetime | None  # None: still open when history was read
    ended_unrecorded: bool = False

    def seconds(self, since: datetime, until: datetime) -> float:
        """How much of the holding falls inside ``since`` .. ``until``."""
        end = self.end if self.end is not None else until
        if self.ended_unrecorded:
            end = self.start
        return max((min(end, until) - max(self.start, since)).total_seconds(), 0.0)


@dataclass(slots=True)
class UsageRow:
    """One group's totals."""

    key: str
    gpu_hours: float = 0.0
    slot_hours: float = 0.0
    holdings: int = 0
    jobs: set[str] = field(default_factory=set)


def holdings(
    entries: Iterable[Stored],
    current: Mapping[tuple[str, str], object],
    now: datetime | None = None,
) -> list[Holding]:
    """Every holding ``entries`` record (any order); ``current``: the assignments that exist.

    Keyed (host, job); an open holding without a current assignment ended
    unrecorded; a current assignment whose start history no longer has
    holds since its own time. ``now``: the reader's clock, the latest any
    entry may be.
    """
    ordered = sorted(entries, key=lambda s: (s.revision, s.entry.seq))
    open_: dict[tuple[str, str], Holding] = {}
    done: list[Holding] = []
    oldest: dict[str, datetime] = {}  # each host's oldest entry kept: trimmed starts begin there
    for stored, at in zip(ordered, store_times(ordered, now), strict=True):
        entry = stored.entry
        if entry.host is None or entry.job is None or at is None:
            continue
        start = oldest.setdefault(entry.host, at)
        key = (entry.host, entry.job)
        if entry.action in _ENDS:
            if key in open_:
                done.append(_ended(open_.pop(key), at))
            elif entry.from_mode == "gpu" and entry.from_gpus:  # its start was trimmed
                done.append(_holding(entry, entry.from_gpus, 1, start, at))
        if entry.action in ("set", "move") and entry.to_mode == "gpu" and entry.to_gpus:
            open_[key] = _holding(entry, entry.to_gpus, entry.slots or 1, at, None)
    for key, holding in open_.items():
        if key not in current:
            holding = replace(holding, ended_unrecorded=True)
        done.append(holding)
    done.extend(_untracked(current, open_, oldest, now))
    return done


def store_times(ordered: Sequence[Stored], now: datetime | None) -> list[datetime | None]:
    """Each entry's time (in store order), bounded by the entries other machines wrote around it.

    The store's order is the one clock every writer shares: an entry cannot
    have happened before one the store ordered ahead of it, nor after one
    it ordered behind it. The nearest entry of another machine on each side
    bounds it (a machine's own entries share its error and bound nothing);
    bounds that contradict each other are left out.
    """
    raw = [parse_time(s.entry.at) for s in ordered]
    if now is not None:
        raw = [min(t, now) if t is not None else None for t in raw]
    machines = [_machine(s.entry.by) for s in ordered]
    before = _nearest_other(raw, machines)
    after = _nearest_other(raw[::-1], machines[::-1])[::-1]
    bounded: list[datetime | None] = []
    for at, low, high in zip(raw, before, after, strict=True):
        if at is not None and not (low is not None and high is not None and low > high):
            at = max(at, low) if low is not None else at
            at = min(at, high) if high is not None else at
        bounded.append(at)
    return bounded


def _nearest_other(
    times: Sequence[datetime | None], machines: Sequence[str]
) -> list[datetime | None]:
    """For each entry, the time of the nearest one before it that another machine wrote."""
    found: list[datetime | None] = []
    last: tuple[str, datetime] | None = None  # the latest timed entry: its machine and time
    other: datetime | None = None  # the latest of a machine other than ``last``'s
    for at, machine in zip(times, machines, strict=True):
        found.append(None if last is None else last[1] if last[0] != machine else other)
        if at is None:
            continue
        if last is not None and last[0] != machine:
            other = last[1]
        last = (machine, at)
    return found


def _machine(by: str) -> str:
    """The machine part of who wrote an entry (``node1`` of ``alice@node1``)."""
    return by.rpartition("@")[2]


def _holding(
    entry: HistoryEntry, gpus: Sequence[int], slots: int, start: datetime, end: datetime | None
) -> Holding:
    assert entry.host is not None and entry.job is not None
    return Holding(entry.host, entry.job, holder_of(entry), len(gpus), slots, start, end)


def _untracked(
    current: Mapping[tuple[str, str], object],
    tracked: Mapping[tuple[str, str], Holding],
    oldest: Mapping[str, datetime],
    now: datetime | None,
) -> list[Holding]:
    """The current assignments whose start history trimmed: open since their own time."""
    found = []
    for (host, job), held in current.items():
        if (host, job) in tracked or not isinstance(held, Assignment):
            continue
        opened = _opened(held, oldest.get(host), now)
        if opened is not None:
            holder, start = opened
            found.append(Holding(host, job, holder, len(held.gpus), held.slots, start, None))
    return found


def open_spans(assignments: Iterable[Assignment], now: datetime) -> list[Span]:
    """The spans of ``assignments`` held now, each from its own time up to ``now`` (pure).

    What :func:`holdings` counts for an assignment no history read tracks
    (the rollup's count: its rows hold only ended holdings), without the
    :class:`Holding` of each: a fleet holds tens of thousands.
    """
    until = now.timestamp()
    spans: list[Span] = []
    for held in assignments:
        opened = _opened(held, None, now)
        if opened is not None:
            holder, start = opened
            spans.append(
                (held.host, held.job, holder, len(held.gpus), held.slots, start.timestamp(), until)
            )
    return spans


def _opened(
    held: Assignment, oldest: datetime | None, now: datetime | None
) -> tuple[str, datetime] | None:
    """Who holds ``held`` and since when (``oldest`` if its time is unreadable); None: no GPUs."""
    if held.mode != "gpu" or not held.gpus:
        return None
    start = parse_time(held.updated_at) or oldest
    if start is None:
        return None
    if now is not None:
        start = min(start, now)
    return held.holder or held.updated_by.split("@", 1)[0] or held.updated_by, start


def summarize(
    found: Sequence[Holding],
    by: str,
    since: datetime,
    until: datetime,
    group_of: Callable[[Holding], Sequence[str]],
) -> list[UsageRow]:
    """Totals per group, most GPU-hours first (pure).

    ``group_of`` names a holding's groups: each is credited in full (a user
    in two teams counts for both, as both teams' quotas charge it).
    """
    rows: dict[str, UsageRow] = {}
    for holding in found:
        seconds = holding.seconds(since, until)
        if seconds <= 0:
            continue
        for group in group_of(holding):
            row = rows.setdefault(group, UsageRow(group))
            row.gpu_hours += holding.gpus * seconds / 3600
            row.slot_hours += holding.gpus * holding.slots * seconds / 3600
            row.holdings += 1
            row.jobs.add(holding.job)
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key))


def span_of(holding: Holding, until: datetime) -> Span:
    """``holding`` as a span (one still open ends at ``until``; one ended unrecorded at once)."""
    end = holding.end if holding.end is not None else until
    start = holding.start.timestamp()
    stop = start if holding.ended_unrecorded else end.timestamp()
    return (holding.host, holding.job, holding.holder, holding.gpus, holding.slots, start, stop)


def summarize_spans(
    spans: Iterable[Span],
    since: datetime,
    until: datetime,
    group_of: Callable[[str, str, str], Sequence[str]],
) -> list[UsageRow]:
    """:func:`summarize` of spans (pure); ``group_of`` takes a span's host, job and holder."""
    low, high = since.timestamp(), until.timestamp()
    rows: dict[str, UsageRow] = {}
    for host, job, holder, gpus, slots, start, end in spans:
        seconds = min(end, high) - max(start, low)
        if seconds <= 0:
            continue
        hours = gpus * seconds / 3600
        for group in group_of(host, job, holder):
            row = rows.get(group)
            if row is None:
                row = rows[group] = UsageRow(group)
            row.gpu_hours += hours
            row.slot_hours += hours * slots
            row.holdings += 1
            row.jobs.add(job)
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key))


def _ended(holding: Holding, at: datetime) -> Holding:
    return replace(holding, end=at)
