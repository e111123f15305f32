"""``allocator history prune``: age out the streams nobody appends to any more.

An append drops its own stream's entries older than ``history.max_age``
(:func:`allocator.history.append.append_plan`), so a stream that is
written to stays within the age. A stream nobody writes to does not: a
host that left the fleet, or one whose jobs never change. Prune reads every
stream's oldest entries (a page of :data:`PAGE`, the streams' first pages
batched 32 to a request) and drops those past the age, a page per
transaction, each comparing the stream's head, so it races no append. A
stream of a host the applied policy no longer declares loses its head too
once it has no entry left: ``history`` then lists the host no more. Prune
also cuts the hours of the fleet's index that no append cut (an hour
nobody appended in: :mod:`allocator.history.index`), and the usage
rollup's days that ended before the age, merging the past days' row keys
(:mod:`allocator.history.rollup`): usage is kept as long as history.

It is safe to run at any time and as often as wanted (a cron job, daily):
what it drops the next append would have dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from allocator.errors import CasConflict
from allocator.history import index as history_index
from allocator.history.append import Head, aged_count, head_of, oldest_times, recover_head
from allocator.history.read import head_hosts
from allocator.history.rollup import compactions, day_prefix, stale_days
from allocator.history.stream import OnBad, Stream, host_stream, policy_stream
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryHead
from allocator.store import Compare, Delete, Listing, Op, Put, Read, Store
from allocator.util.times import format_time

__all__ = ["PAGE", "PruneResult", "prune_history"]

#: Entries dropped per transaction (within every backend's 64 operations).
PAGE = 60
#: Past days whose usage rows one prune merges (a daily prune needs only yesterday).
_COMPACTED_DAYS = 31
#: Times a day's keys are merged (30 rows a key, then 900, then :data:`MAX_ROWS`).
_MERGE_LEVELS = 3
#: Streams whose first pages one request reads.
_STREAMS_PER_READ = 32
#: Tries per page when an append moved the head meanwhile.
_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What a prune dropped: entries, from how many streams, and the hosts whose stream went."""

    max_age_seconds: float
    streams: int = 0
    entries: int = 0
    pruned_streams: int = 0
    removed: tuple[str, ...] = ()
    #: Hours of the fleet's index no append had cut (each one prefix delete).
    index_hours: int = 0


def prune_history(
    store: Store,
    layout: KeyLayout,
    declared: frozenset[str],
    max_age: float,
    now: datetime,
    on_bad: OnBad,
) -> PruneResult:
    """Drop every entry older than ``max_age`` before ``now``; remove emptied streams of hosts
    not in ``declared`` (the applied policy's hosts)."""
    streams = [*_host_streams(store, layout, on_bad), policy_stream(layout)]
    stamp = format_time(now)
    entries, pruned, removed = 0, 0, []
    for batch in _batches(streams, _STREAMS_PER_READ):
        found = store.read_many([r for s in batch for r in _reads(s)])
        for index, stream in enumerate(batch):
            gone = stream.host is not None and stream.host not in declared
            dropped, emptied = _prune_stream(
                store, stream, found[2 * index : 2 * index + 2], max_age, stamp, gone, on_bad
            )
            entries += dropped
            pruned += dropped > 0
            if emptied and stream.host is not None:
                removed.append(stream.host)
    hours = _trim_index(store, layout, now)
    _trim_rollup(store, layout, now - timedelta(seconds=max_age), now)
    return PruneResult(max_age, len(streams), entries, pruned, tuple(removed), hours)


def _trim_index(store: Store, layout: KeyLayout, now: datetime) -> int:
    """Delete the index's hours older than its appends keep (one keys-only read: the
    index holds about two hours); return how many."""
    (keys,) = store.read_many(
        [Read(history_index.recent_prefix(layout.history), prefix=True, values=False)]
    )
    doomed = history_index.stale_hours(
        layout.history, [kv.key for kv in keys.items], int(now.timestamp())
    )
    for start in range(0, len(doomed), PAGE):
        store.txn([], doomed[start : start + PAGE])
    return len(doomed)


def _trim_rollup(store: Store, layout: KeyLayout, cutoff: datetime, now: datetime) -> None:
    """Delete the usage rollup's days that ended before ``cutoff`` (prefix deletes, no read),
    and merge the row keys of the past days since (at most :data:`_COMPACTED_DAYS`)."""
    doomed = stale_days(layout.history, cutoff)
    for start in range(0, len(doomed), PAGE):
        store.txn([], doomed[start : start + PAGE])
    for back in range(1, _COMPACTED_DAYS + 1):
        day = now - timedelta(days=back)
        if day < cutoff - timedelta(days=1):
            break
        for _level in range(_MERGE_LEVELS):
            listing = store.list(day_prefix(layout.history, day))
            merges = compactions(layout.history, listing.items)
            for compares, ops in merges:
                with contextlib.suppress(CasConflict):  # a late row or another prune: next time
                    store.txn(compares, ops)
            if not merges:
                break


def _prune_stream(
    store: Store,
    stream: Stream,
    first: Sequence[Listing],
    max_age: float,
    now: str,
    gone: bool,
    on_bad: OnBad,
) -> tuple[int, bool]:
    """Drop ``stream``'s aged entries a page at a time; return how many, and if it was removed."""
    dropped, conflicts = 0, 0
    reads = first
    while conflicts < _ATTEMPTS:
        head = _head(store, stream, reads[0], on_bad)
        aged = aged_count(oldest_times(reads[1], stream, head), now, max_age)
        emptied = gone and aged == head.next - head.first
        if aged == 0 and not emptied:
            break
        try:
            ops = _page_ops(stream, head, aged, emptied)
            store.txn([Compare(stream.head_key, head.revision)], ops)
        except CasConflict:
            conflicts += 1  # an append moved the head: read again
        else:
            dropped += aged
            if emptied or aged < PAGE:
                return dropped, emptied
        reads = store.read_many(_reads(stream))
    return dropped, False


def _reads(stream: Stream) -> list[Read]:
    """The stream's head and its oldest page."""
    return [Read(stream.head_key), Read(stream.prefix, prefix=True, limit=PAGE)]


def _page_ops(stream: Stream, head: Head, aged: int, emptied: bool) -> list[Op]:
    """Delete the ``aged`` oldest entries; rewrite the head past them (or delete it)."""
    ops: list[Op] = [Delete(stream.entry_key(head.first + i)) for i in range(aged)]
    if emptied:
        ops.append(Delete(stream.head_key))
    else:
        bounds = HistoryHead(
            stream.name, head.first + aged, head.next, head.limit, max_age_seconds=head.max_age
        )
        ops.append(Put(stream.head_key, bounds.to_json()))
    return ops


def _head(store: Store, stream: Stream, read: Listing, on_bad: OnBad) -> Head:
    item = read.items[0] if read.items else None
    head = head_of(item, stream, on_bad)
    if head is None:
        head = recover_head(store, stream, item.mod_revision if item is not None else 0)
    return head


def _host_streams(store: Store, layout: KeyLayout, on_bad: OnBad) -> list[Stream]:

    (heads,) = store.read_many([Read(layout.history_heads, prefix=True, values=False)])
    return [host_stream(layout, name) for _kv, name in head_hosts(heads, layout, on_bad)]


def _batches(items: list[Stream], size: int) -> Iterator[list[Stream]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
