"""Appending to a history stream: its head, its limit and its age cut.

An entry is appended in the same transaction as the change it records (see
:func:`allocator.control.write_cache.plan_change`), so history can
never disagree with the assignments. The append compares the stream's head,
so two writers never take one sequence number; the head names the oldest
entry, so the entry to drop once the stream is over its limit is known
without reading the stream. Each append also writes the entry's pointer in
the fleet's index of recent entries (:mod:`allocator.history.index`),
and cuts its oldest hour.

The limit is the policy's ``history.entries_per_host``, and its
``history.max_age`` drops entries older than that: an append reads the
stream's oldest few entries (:data:`MAX_TRIM` + 1, one small range read,
ordered oldest first) and drops those past the age, judged by the new
entry's own time, so the clock is the writer's. A writer without a policy at
hand (``release``) keeps the limit and age the head was last written with.
A lowered limit (or a newly set age) drops at most :data:`MAX_TRIM` old
entries per append, so every transaction stays small; the stream shrinks
over the next appends. A stream nobody appends to any more (a host that
left) is cut by ``allocator history prune`` (:mod:`allocator.history.prune`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as replace_dataclass
from datetime import timedelta

from allocator.errors import BadRecord
from allocator.history.index import index_ops
from allocator.history.rollup import rollup_ops, rows_of
from allocator.history.stream import OnBad, Stream, decode_entry
from allocator.policy.model import HistorySettings
from allocator.records.codec import decode_record, replace_struct
from allocator.records.types import HistoryEntry, HistoryHead
from allocator.store import Compare, Delete, KeyValue, Listing, Op, Put, Read, Store
from allocator.util.times import parse_time

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_TRIM",
    "OLDEST",
    "Head",
    "aged_count",
    "append_ops",
    "append_plan",
    "head_of",
    "oldest_read",
    "oldest_times",
    "prepare_append",
    "read_head",
    "recover_head",
]

#: The entries kept per stream when the policy does not say (``history.entries_per_host``).
DEFAULT_LIMIT = 1000
#: Old entries one append may drop beyond its own: bounds the transaction's size.
MAX_TRIM = 4
#: Oldest entries an append reads to find those past ``history.max_age``.
OLDEST = MAX_TRIM + 1


@dataclass(frozen=True, slots=True)
class Head:
    """A stream's head as read: entries ``first`` .. ``next - 1``, and the key's revision.

    ``max_age``: the age (seconds) it was last written with; ``oldest``: the
    times (``at``) of entries ``first``, ``first + 1``, ... as read, for the
    age cut (empty: not read, or nothing held).
    """

    first: int = 0
    next: int = 0
    limit: int = DEFAULT_LIMIT
    revision: int = 0
    max_age: float | None = None
    oldest: tuple[str, ...] = ()


def read_head(store: Store, stream: Stream, on_bad: OnBad) -> Head:
    """The stream's head and its oldest entries' times (one request).

    Without a usable head, bounds are recovered from the entries' keys: a
    head deleted or damaged by hand must not make the next append reuse a
    sequence number (it would overwrite an entry), so only then is the
    stream listed.
    """
    head_read, oldest = store.read_many([Read(stream.head_key), oldest_read(stream)])
    item = head_read.items[0] if head_read.items else None
    head = head_of(item, stream, on_bad)
    if head is None:
        head = recover_head(store, stream, item.mod_revision if item is not None else 0)
    return replace_dataclass(head, oldest=oldest_times(oldest, stream, head))


def oldest_read(stream: Stream) -> Read:
    """The read of the stream's :data:`OLDEST` oldest entries (for :func:`oldest_times`)."""
    return Read(stream.prefix, prefix=True, limit=OLDEST)


def oldest_times(listing: Listing, stream: Stream, head: Head) -> tuple[str, ...]:
    """The times of entries ``head.first``, ``head.first + 1``, ... that ``listing`` holds.

    Stops at the first gap or undecodable entry: the age cut only drops a
    run of entries it knows to be old, from the oldest on.
    """
    times: list[str] = []
    for item in listing.items:
        if stream.seq_of(item.key) != head.first + len(times):
            break
        try:
            times.append(decode_entry(item, stream).at)
        except BadRecord:
            break
    return tuple(times)


def recover_head(store: Store, stream: Stream, revision: int) -> Head:
    """Bounds recovered from the entries' keys, for a stream without a usable head.

    ``revision`` is the head key's (0: absent), for the next append to compare.
    """
    seqs = (stream.seq_of(kv.key) for kv in store.list(stream.prefix).items)
    known = sorted(s for s in seqs if s is not None)
    if not known:
        return Head(revision=revision)
    return Head(known[0], known[-1] + 1, DEFAULT_LIMIT, revision)


def head_of(item: KeyValue | None, stream: Stream, on_bad: OnBad) -> Head | None:
    """The head a read of ``stream.head_key`` holds (pure); ``None``: no usable head.

    A damaged head is reported to ``on_bad``; without a usable head the
    bounds must be recovered from the entries (:func:`read_head` does that).
    """
    if item is None:
        return None
    try:
        head = decode_record(item.value, HistoryHead, item.key)
        if head.stream != stream.name:
            raise BadRecord(item.key, f"it names stream {head.stream!r}")
        if head.first > head.next:
            raise BadRecord(item.key, f"first {head.first} is past next {head.next}")
    except BadRecord as exc:
        on_bad(exc)
        return None
    return Head(head.first, head.next, head.limit, item.mod_revision, head.max_age_seconds)


def append_ops(
    stream: Stream,
    head: Head,
    entry: HistoryEntry,
    keep: HistorySettings | None,
    max_trim: int = MAX_TRIM,
    *,
    indexed: bool = True,
) -> tuple[Compare, list[Op]]:
    """The compare and writes that append ``entry`` (pure).

    ``keep``: the policy's history settings (``None``: the head's limit and
    age). Drops the oldest entries beyond the limit or older than the age,
    at most ``max_trim`` of them besides the one the new entry displaces
    (a transaction touching many hosts passes 0: at most 4 operations a host).
    ``indexed``: also write the entry's pointer in the fleet's index and trim
    the index's oldest hour (2 operations), and the usage row of the holding
    it ends (:mod:`allocator.history.rollup`); a transaction touching many
    hosts passes ``False`` and writes one pointer and one row key for all.
    """
    compare, ops, _ = append_plan(stream, head, entry, keep, max_trim, indexed=indexed)
    return compare, ops


def append_plan(
    stream: Stream,
    head: Head,
    entry: HistoryEntry,
    keep: HistorySettings | None,
    max_trim: int = MAX_TRIM,
    *,
    indexed: bool = True,
) -> tuple[Compare, list[Op], Head]:
    """:func:`append_ops`, and the head the stream has once they are written (pure).

    The returned head's ``revision`` is 0: the caller knows it once the
    transaction is applied. Its ``oldest`` are the times still known: a
    kept view (:mod:`allocator.control.write_cache`) cuts by age only as far
    as the oldest it read, and the next read (any lost race) brings more.
    """
    limit = head.limit if keep is None else keep.entries_per_host
    max_age = head.max_age if keep is None else keep.max_age_seconds
    seq = head.next
    ops: list[Op] = [Put(stream.entry_key(seq), replace_struct(entry, seq=seq).to_json())]
    excess = (seq + 1 - head.first) - limit
    # Both <= entries held before this one (limit >= 1): no delete hits the new key.
    drop = min(max(excess, aged_count(head.oldest, entry.at, max_age), 0), max_trim + 1)
    ops += [Delete(stream.entry_key(head.first + i)) for i in range(drop)]
    bounds = HistoryHead(stream.name, head.first + drop, seq + 1, limit, max_age_seconds=max_age)
    ops.append(Put(stream.head_key, bounds.to_json()))
    if indexed and stream.root:
        ops += index_ops(stream.root, entry.at, [stream.entry_key(seq)], trim=True)
        ops += rollup_ops(stream.root, stream.entry_key(seq), rows_of([entry]))
    oldest = head.oldest[drop:]
    if len(head.oldest) == seq - head.first and len(oldest) < OLDEST:
        oldest += (entry.at,)  # every entry was known: so is the new one
    after = Head(bounds.first, bounds.next, limit, 0, max_age, oldest)
    return Compare(stream.head_key, head.revision), ops, after


def aged_count(oldest: Sequence[str], now: str, max_age: float | None) -> int:
    """How many of ``oldest`` (times, oldest first) are more than ``max_age`` before ``now``.

    Pure: ``now`` is the new entry's time, so the writer's clock decides.
    An unreadable time stops the count (it is never dropped for its age).
    """
    moment = parse_time(now)
    if max_age is None or moment is None:
        return 0
    cutoff = moment - timedelta(seconds=max_age)
    count = 0
    for text in oldest:
        at = parse_time(text)
        if at is None or at >= cutoff:
            break
        count += 1
    return count


def prepare_append(
    store: Store,
    stream: Stream,
    entry: HistoryEntry,
    keep: HistorySettings | None,
    on_bad: OnBad,
    max_trim: int = MAX_TRIM,
    *,
    indexed: bool = True,
) -> tuple[Compare, list[Op]]:
    """Read the stream's head and return what appends ``entry`` (one transaction's share)."""
    head = read_head(store, stream, on_bad)
    return append_ops(stream, head, entry, keep, max_trim, indexed=indexed)
