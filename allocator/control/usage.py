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

Who held it: the assignment's ``holder`` where the entry records one, else
the user part of who wrote it (``alice`` of ``alice@node1``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from allocator.control.history import Stored
from allocator.records.types import HistoryEntry
from allocator.util.times import parse_time

__all__ = ["BY", "Holding", "UsageRow", "holder_of", "holdings", "summarize"]

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


def holder_of(entry: HistoryEntry) -> str:
    """Who held what ``entry`` set: its ``holder``, else its writer's user part."""
    if entry.holder:
        return entry.holder
    return entry.by.split("@", 1)[0] or entry.by


def holdings(entries: Iterable[Stored], current: Mapping[tuple[str, str], object]) -> list[Holding]:
    """Every holding ``entries`` record (any order); ``current``: the assignments that exist.

    Keyed (host, job); an open holding without a current assignment ended
    unrecorded.
    """
    ordered = sorted(entries, key=lambda s: (s.revision, s.entry.seq))
    open_: dict[tuple[str, str], Holding] = {}
    done: list[Holding] = []
    for stored in ordered:
        entry = stored.entry
        at = parse_time(entry.at)
        if entry.host is None or entry.job is None or at is None:
            continue
        key = (entry.host, entry.job)
        if entry.action in _ENDS and key in open_:
            done.append(_ended(open_.pop(key), at))
        if entry.action in ("set", "move") and entry.to_mode == "gpu" and entry.to_gpus:
            open_[key] = Holding(
                entry.host,
                entry.job,
                holder_of(entry),
                len(entry.to_gpus),
                entry.slots or 1,
                at,
                None,
            )
    for key, holding in open_.items():
        if key not in current:
            holding = replace(holding, ended_unrecorded=True)
        done.append(holding)
    return done


def summarize(
    found: Sequence[Holding],
    by: str,
    since: datetime,
    until: datetime,
    group_of: Callable[[Holding], str],
) -> list[UsageRow]:
    """Totals per group (``group_of`` names a holding's), most GPU-hours first (pure)."""
    rows: dict[str, UsageRow] = {}
    for holding in found:
        seconds = holding.seconds(since, until)
        if seconds <= 0:
            continue
        row = rows.setdefault(group_of(holding), UsageRow(group_of(holding)))
        row.gpu_hours += holding.gpus * seconds / 3600
        row.slot_hours += holding.gpus * holding.slots * seconds / 3600
        row.holdings += 1
        row.jobs.add(holding.job)
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key))


def _ended(holding: Holding, at: datetime) -> Holding:
    return replace(holding, end=at)
