"""Assignment history: who changed what, when and why, kept in the store itself.

Each host has a stream of entries, and so does the policy::

    /allocator/v1/history/heads/hosts/<host>      first and next sequence number, limit
    /allocator/v1/history/hosts/<host>/<seq>      one entry (seq zero-padded: key order)
    /allocator/v1/history/heads/policy
    /allocator/v1/history/policy/<seq>
    /allocator/v1/history/recent/<hour>/<second>/<stream>/<seq>   the fleet's index

Each append also writes the entry's pointer in the fleet's index of recent
entries (:mod:`allocator.control.history_index`), and cuts its oldest hour.

An entry is appended in the same transaction as the change it records (see
:func:`allocator.control.write_cache.plan_change`), so history can
never disagree with the assignments. The append compares the stream's head,
so two writers never take one sequence number; the head names the oldest
entry, so the entry to drop once the stream is over its limit is known
without reading the stream. The entries are ordinary keys, not etcd's MVCC
history, so compacting etcd loses none of them.

The limit is the policy's ``history.entries_per_host``, and its
``history.max_age`` drops entries older than that: an append reads the
stream's oldest few entries (:data:`MAX_TRIM` + 1, one small range read,
ordered oldest first) and drops those past the age, judged by the new
entry's own time, so the clock is the writer's. A writer without a policy at
hand (``release``) keeps the limit and age the head was last written with.
A lowered limit (or a newly set age) drops at most :data:`MAX_TRIM` old
entries per append, so every transaction stays small; the stream shrinks
over the next appends. A stream nobody appends to any more (a host that
left) is cut by ``allocator history prune`` (:mod:`allocator.control.history_prune`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from dataclasses import replace as replace_dataclass
from datetime import datetime, timedelta

from allocator.control.history_entries import change_entry, policy_entry, release_entry
from allocator.control.history_index import index_ops
from allocator.errors import BadRecord, InvalidInput
from allocator.policy.model import HistorySettings
from allocator.records.codec import decode_record, replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry, HistoryHead
from allocator.store import Compare, Delete, KeyValue, Listing, Op, Put, Read, Store
from allocator.util.times import parse_time

__all__ = [
    "ACTIONS",
    "DEFAULT_LIMIT",
    "MAX_TRIM",
    "OLDEST",
    "Head",
    "OnBad",
    "Stored",
    "Stream",
    "aged_count",
    "append_ops",
    "append_plan",
    "change_entry",
    "decode_entry",
    "head_of",
    "host_stream",
    "oldest_read",
    "oldest_times",
    "parse_since",
    "policy_entry",
    "policy_stream",
    "prepare_append",
    "read_head",
    "read_history",
    "read_stream",
    "recover_head",
    "release_entry",
    "select",
]

#: The entries kept per stream when the policy does not say (``history.entries_per_host``).
DEFAULT_LIMIT = 1000
#: Old entries one append may drop beyond its own: bounds the transaction's size.
MAX_TRIM = 4
_SEQ_DIGITS = 12
#: Oldest entries an append reads to find those past ``history.max_age``.
OLDEST = MAX_TRIM + 1

#: Every action an entry may record, and what it means.
ACTIONS = {
    "set": "a job was given GPUs (or the CPU) where it held nothing, or set again as it was",
    "move": "a job's GPUs changed",
    "release": "a job's assignment was removed",
    "expired": "the agent saw a job held by `allocator run` lose its GPUs by lease expiry",
    "fallback": "the agent moved a job off an unavailable GPU (to the CPU, or stopped it)",
    "recover": "the agent returned a job to its GPUs",
    "gave-up": "the agent stopped restarting a job (crash loop, or a `fail` fallback rule)",
    "held": "the agent holds a job in its fallback: its GPUs flapped (flap_restart_limit)",
    "policy-apply": "a policy was applied",
}


@dataclass(frozen=True, slots=True)
class Stream:
    """One bounded history stream: a host's, or the policy's."""

    name: str
    head_key: str
    prefix: str
    host: str | None = None
    #: Where every history key lives (``history/``): the index's pointers go below it
    #: (:mod:`allocator.control.history_index`); empty: no pointers.
    root: str = ""

    def entry_key(self, seq: int) -> str:
        """Where entry ``seq`` lives (zero-padded, so key order is sequence order)."""
        return f"{self.prefix}{seq:0{_SEQ_DIGITS}d}"


def host_stream(layout: KeyLayout, host: str) -> Stream:
    """The history stream of ``host``."""
    return Stream(
        f"hosts/{host}",
        layout.host_history_head(host),
        layout.host_history(host),
        host,
        layout.history,
    )


def policy_stream(layout: KeyLayout) -> Stream:
    """The history stream of the applied policy."""
    return Stream("policy", layout.policy_history_head, layout.policy_history, root=layout.history)


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


@dataclass(frozen=True, slots=True)
class Stored:
    """An entry as read, with the store revision that wrote it."""

    entry: HistoryEntry
    revision: int


OnBad = Callable[[BadRecord], None]


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
        if _seq(item.key, stream) != head.first + len(times):
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
    seqs = (_seq(kv.key, stream) for kv in store.list(stream.prefix).items)
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
    the index's oldest hour (2 operations); a transaction touching many hosts
    passes ``False`` and writes one pointer for all (:func:`index_ops`).
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


# --- reading ---------------------------------------------------------------------------


def read_stream(store: Store, stream: Stream, on_bad: OnBad) -> list[Stored]:
    """Every entry of ``stream`` (one range read), oldest first; bad ones reported, skipped."""
    found: list[Stored] = []
    for item in store.list(stream.prefix).items:
        try:
            found.append(Stored(decode_entry(item, stream), item.mod_revision))
        except BadRecord as exc:
            on_bad(exc)
    return found


def read_history(
    store: Store,
    layout: KeyLayout,
    on_bad: OnBad,
    *,
    host: str | None = None,
    with_policy: bool = True,
) -> list[Stored]:
    """Entries of one host (or of every host that has history), and the policy's; newest first.

    Every host is read on its own (its head names it), so no single read
    grows with the fleet.
    """
    if host is not None:
        hosts: Iterable[str] = [host]
    else:
        heads = store.list(layout.history_heads).items
        hosts = sorted({kv.key[len(layout.history_heads) :] for kv in heads})
    found: list[Stored] = []
    for name in hosts:
        found += read_stream(store, host_stream(layout, name), on_bad)
    if with_policy:
        found += read_stream(store, policy_stream(layout), on_bad)
    return sorted(found, key=lambda s: (s.revision, s.entry.seq), reverse=True)


def select(
    entries: Sequence[Stored],
    *,
    job: str | None = None,
    gpu: int | None = None,
    since: datetime | None = None,
) -> list[Stored]:
    """The entries naming ``job``, touching ``gpu``, and made at or after ``since``."""
    chosen = []
    for stored in entries:
        entry = stored.entry
        if job is not None and entry.job != job:
            continue
        if gpu is not None and gpu not in (*entry.from_gpus, *entry.to_gpus):
            continue
        if since is not None:
            at = parse_time(entry.at)
            if at is None or at < since:
                continue
        chosen.append(stored)
    return chosen


def decode_entry(item: KeyValue, stream: Stream) -> HistoryEntry:
    """The entry stored at ``item`` of ``stream``; ``BadRecord`` if it is not one."""
    seq = _seq(item.key, stream)
    if seq is None:
        raise BadRecord(item.key, "not a history entry key (<prefix>/<12-digit sequence>)")
    entry = decode_record(item.value, HistoryEntry, item.key, host=stream.host)
    if entry.seq != seq:
        raise BadRecord(item.key, f"its seq {entry.seq} disagrees with the key")
    return entry


def _seq(key: str, stream: Stream) -> int | None:
    tail = key[len(stream.prefix) :]
    if len(tail) != _SEQ_DIGITS or not tail.isascii() or not tail.isdigit():
        return None
    return int(tail)


# --- --since ----------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"(?:\d{1,6}[smhdw])+", re.ASCII)
_PART = re.compile(r"(\d+)([smhdw])", re.ASCII)
#: Further back than this is a typo (and timedelta would overflow long before a billion days).
_MAX_SINCE = timedelta(days=36_500)


def parse_since(text: str, now: datetime) -> datetime:
    """``30m``, ``2h``, ``7d``, ``1w``, ``1h30m`` before ``now``, or an RFC 3339 time.

    ``InvalidInput`` (exit 2) naming what is accepted, for anything else.
    """
    shown = text if len(text) <= 40 else f"{text[:37]}..."
    if _DURATION.fullmatch(text):
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
        span = timedelta(seconds=seconds)
        if span > _MAX_SINCE:
            raise InvalidInput(f"--since {shown}: more than {_MAX_SINCE.days:,} days back")
        return now - span
    moment = parse_time(text) if len(text) <= 40 and "T" in text.upper() else None
    if moment is None:
        raise InvalidInput(
            f"--since {shown!r}: expected a duration (30m, 2h, 7d, 1w, 1h30m) "
            "or an RFC 3339 time (2026-11-30T14:00:00Z)"
        )
    if moment.tzinfo is None:
        raise InvalidInput(f"--since {shown}: give the time zone (Z or +02:00)")
    return moment
