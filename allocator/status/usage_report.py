"""The usage report (``allocator usage``, serve's ``/api/v1/usage``): one read, one document.

The ended holdings are read from the usage rollup's days inside the window
(:mod:`allocator.history.rollup`), the current assignments once
(:func:`read_usage`); before the rollup was rebuilt, history is read whole
instead. The pure parts in :mod:`allocator.history.usage` then count the
holdings, and :func:`usage_document` makes any window (from the read's
``since`` on) and grouping's document from that one read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from allocator.history.usage import (
    Holding,
    Span,
    UsageRow,
    holdings,
    open_spans,
    span_of,
    summarize_spans,
)
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.errors import BadRecord
    from allocator.policy import Policy
    from allocator.records.keys import KeyLayout
    from allocator.records.types import Assignment
    from allocator.status.snapshots import PolicySnapshot
    from allocator.store import KeyValue, Store

__all__ = [
    "NO_POOL",
    "NO_TEAM",
    "UsageRead",
    "UsageSource",
    "assignments_in",
    "read_usage",
    "usage_document",
    "usage_report",
]

NO_TEAM = "(no team)"
NO_POOL = "(no pool)"
#: Hosts to one key range (etcd) of the current assignments' read: each answer stays small.
_HOSTS_PER_RUN = 500


class UsageSource(Protocol):
    """What the report reads through (an :class:`~allocator.control.client.Allocator` is one)."""

    @property
    def store(self) -> Store: ...
    @property
    def layout(self) -> KeyLayout: ...
    @property
    def on_bad_record(self) -> Callable[[BadRecord], None]: ...
    def policy(self) -> PolicySnapshot | None: ...


@dataclass(frozen=True, slots=True)
class UsageRead:
    """What every usage document is counted from: one read of the rollup (or history).

    ``since``: the earliest window it can count (``None``: any, history was
    read whole); ``source``: ``rollup`` or ``history`` (no rollup yet).
    """

    found: list[Holding]
    policy: Policy | None
    now: datetime
    since: datetime | None = None
    source: str = "history"
    #: Counted as they are: the rollup's rows, and the open assignments read with them.
    spans: list[Span] = field(default_factory=list)


def read_usage(
    allocator: UsageSource,
    now: datetime,
    since: datetime | None = None,
    current: Iterable[Assignment] | None = None,
) -> UsageRead:
    """The holdings up to ``now``: the rollup's days from ``since`` and the open assignments.

    ``current``: the assignments that exist now, when the caller has them
    (``serve``'s mirror); else they are read from the store.

    Without a rollup (``allocator usage --rebuild`` never ran) or without
    ``since``, history is read whole and counted as before.
    """
    from allocator.history.rollup import read_rollup
    from allocator.history.stream import read_history

    snapshot = allocator.policy()
    policy = snapshot.policy if snapshot is not None else None
    history = allocator.layout.history
    ended = None
    if since is not None:
        ended = read_rollup(allocator.store, history, since, now, allocator.on_bad_record)
    held = current if current is not None else _held_now(allocator, snapshot)
    if ended is not None:
        # The rollup holds only ended holdings: every current assignment is open
        # since its own time, counted as a span as it is read (none is kept).
        return UsageRead([], policy, now, since, "rollup", ended + open_spans(held, now))
    by_job = {(a.host, a.job): a for a in held}
    entries = read_history(
        allocator.store, allocator.layout, allocator.on_bad_record, with_policy=False
    )
    return UsageRead(holdings(entries, by_job, now), policy, now)


def usage_report(
    allocator: UsageSource, since: datetime, by: str, now: datetime, limit: int | None = None
) -> tuple[dict[str, Any], list[UsageRow]]:
    """The JSON document of the usage since ``since`` grouped ``by``, and its rows."""
    return usage_document(read_usage(allocator, now, since), since, by, limit)


def usage_document(
    read: UsageRead, since: datetime, by: str, limit: int | None = None
) -> tuple[dict[str, Any], list[UsageRow]]:
    """The document of ``read``'s usage since ``since`` grouped ``by``, and its rows (pure).

    ``limit``: keep only the first (largest) rows; ``rows_total`` says how many there were.
    """
    spans = read.spans + [span_of(h, read.now) for h in read.found]
    rows = summarize_spans(spans, since, read.now, group_of(by, read.policy))
    unended = sum(1 for h in read.found if h.ended_unrecorded and h.start >= since)
    shown = rows if limit is None else rows[:limit]
    document = {
        "since": format_time(since),
        "until": format_time(read.now),
        "by": by,
        "rows": [_row_document(row) for row in shown],
        "unended": unended,
        "source": read.source,
    }
    if limit is not None:
        document["rows_total"] = len(rows)
    return document, shown


def group_of(by: str, policy: Policy | None) -> Callable[[str, str, str], Sequence[str]]:
    """The function naming the groups of a holding (its host, job, holder) for ``--by``.

    A user's every team; a host's pool and a holder's teams are found once each.
    """
    if by == "user":
        return lambda host, job, holder: (holder,)
    if by == "job":
        return lambda host, job, holder: (job,)
    if by == "host":
        return lambda host, job, holder: (host,)
    if by == "pool":
        pools = functools.cache(lambda host: (_pool(policy, host),))
        return lambda host, job, holder: pools(host)
    teams = functools.cache(lambda holder: _teams(policy, holder))
    return lambda host, job, holder: teams(holder)


def _held_now(allocator: UsageSource, snapshot: PolicySnapshot | None) -> Iterator[Assignment]:
    """Every assignment that exists now, each decoded as it is read.

    Under a policy, only its hosts' ``jobs/`` keys are read, in runs of
    hosts next to each other in key order: an agent's record (its GPUs,
    their processes) is most of a busy host's bytes, and usage needs none
    of it. On etcd a run is one key range, all at one revision; on the
    other stores each host's jobs are one query of a run's read. (An
    assignment a forced ``policy apply`` left on a host it removed is
    counted from history when it ends, not while it is open.) Without a
    policy, one read of the hosts' keys.
    """
    layout = allocator.layout
    if snapshot is None or snapshot.host is not None:
        return assignments_in(allocator.store.list(layout.hosts).items, layout)
    prefixes = sorted(layout.host_jobs(host) for host in snapshot.policy.hosts)
    if not prefixes:
        return iter(())
    runs = [prefixes[at : at + _HOSTS_PER_RUN] for at in range(0, len(prefixes), _HOSTS_PER_RUN)]
    # One revision for every run (etcd): the store's now, as one small read of keys
    # every reader of assignments may read names it (the policy snapshot's revision
    # is its own key's, older than assignments written since).
    now = allocator.store.list(prefixes[0], limit=1).revision
    listings = allocator.store.list_runs(runs, now)
    return assignments_in((item for listing in listings for item in listing.items), layout)


def assignments_in(items: Iterable[KeyValue], layout: KeyLayout) -> Iterator[Assignment]:
    """The assignments among ``items`` (keys under the hosts prefix), decoded one at a time.

    Only the jobs' keys are decoded: an agent's record (its GPUs, their
    processes) is most of a busy host's bytes, and usage needs none of it.
    A record that does not decode, or names another host or job than its
    key, is left out (``status`` lists it).
    """
    from allocator.errors import BadRecord
    from allocator.records.codec import decode_record
    from allocator.records.keys import split_host_key
    from allocator.records.types import Assignment

    hosts = layout.hosts
    for item in items:
        part = split_host_key(item.key, hosts)
        if part is None or part[1] != "jobs" or not part[2]:
            continue
        host, _kind, job = part
        try:
            yield decode_record(item.value, Assignment, item.key, job=job, host=host)
        except BadRecord:
            continue


def _pool(policy: Policy | None, host: str) -> str:
    pool = policy.pool_of(host) if policy is not None else None
    return pool.name if pool is not None else NO_POOL


def _teams(policy: Policy | None, user: str) -> tuple[str, ...]:
    """The policy's teams of ``user`` (its ``teams:`` members), each charged as quotas charge."""
    teams = sorted(str(n) for n, t in (policy.teams if policy else {}).items() if user in t.members)
    return tuple(teams) or (NO_TEAM,)


def _row_document(row: UsageRow) -> dict[str, Any]:
    return {
        "key": row.key,
        "gpu_hours": round(row.gpu_hours, 6),
        "slot_hours": round(row.slot_hours, 6),
        "holdings": row.holdings,
        "jobs": sorted(row.jobs),
    }
