"""The fleet's index of recent history entries: newest first by key.

Every append also writes one small pointer key, in the same transaction::

    /allocator/v1/history/recent/<hour>/<second>/hosts/<host>/<seq>
    /allocator/v1/history/recent/<hour>/<second>/policy/<seq>

``<second>`` is ``10**11`` minus the entry's time in seconds (its ``at``:
the writer's clock, at the second entries keep) and ``<hour>`` the same,
in hours: both count down, so the newest pointer is the *first* key of the
prefix. A fleet-wide ``history --limit 20`` reads the first pointers back
from the reader's clock, a few 100-second buckets (key prefixes: the
second's first nine digits) a request, each an ascending range with a
limit: etcd walks every key of a range to count it, limit or not, so no
read spans the whole index. Then one read of the pointers of the last
second reached (entries of one second are ranked by the revision that
wrote them, which a pointer shares with its entry), and one batched read
of the entries (:func:`allocator.history.read.read_recent`); it
never ranks 12,500 heads. The
tail of the key is the entry's key below ``history/``, so the value is empty;
a transaction that appends to several hosts at once writes one pointer,
naming the other entries in its value (one per line), so that it stays
within every backend's 64 operations.

The index is trimmed without a read: each single-stream append deletes the
whole hour :data:`KEPT_HOURS` hours before its own (one prefix delete:
etcd's DeleteRange, Consul's ``delete-tree``), so the index holds about
the last two hours of appends. An hour nobody appended in is left for
``allocator history prune`` (:func:`stale_hours`). A pointer whose entry was
dropped meanwhile is harmless: the reader sees the entry gone and falls back
to ranking the streams' heads (:mod:`allocator.history.read`), as it
does when the index holds fewer entries than asked for (a quiet fleet, or
entries written by a version without the index).
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.store import Delete, KeyValue, Op, Put
from allocator.util.times import parse_time

__all__ = [
    "AHEAD_BUCKETS",
    "BUCKET",
    "HOUR",
    "KEPT_HOURS",
    "bucket_prefixes",
    "entry_keys",
    "hour_of",
    "index_ops",
    "pointer_key",
    "recent_prefix",
    "second_prefix",
    "stale_hours",
    "trim_op",
]

#: One bucket of the index (its ``<hour>`` segment), in seconds.
HOUR = 3600
#: An append deletes the hour this many before its own: the index keeps the hours between.
KEPT_HOURS = 2
#: What one prefix read of the index covers, in seconds (divides :data:`HOUR`). etcd walks
#: every key of a range to count them, limit or not: reads stay within a few buckets.
BUCKET = 100
#: Buckets a reader reads ahead of its own clock: writers whose clocks run ahead.
AHEAD_BUCKETS = 6
_SECOND_DIGITS = 11
_TOP = 100_000_000_000  # 10**11 seconds: until the year 5138
_HOUR_DIGITS = 8


def recent_prefix(history: str) -> str:
    """The index's prefix below ``history`` (the layout's ``history``)."""
    return f"{history}recent/"


def _seconds(at: str) -> int | None:
    moment = parse_time(at)
    if moment is None or moment.tzinfo is None:
        return None
    return min(max(int(moment.timestamp()), 0), _TOP - 1)


def hour_of(seconds: int) -> int:
    """The ``<hour>`` bucket of a time in seconds since the epoch (newer: smaller)."""
    return (_TOP - 1 - seconds) // HOUR


def pointer_key(history: str, at: str, entry_key: str) -> str | None:
    """The index key for the entry at ``entry_key`` written at ``at`` (pure).

    ``None`` for an unreadable time (no entry this code builds has one).
    """
    seconds = _seconds(at)
    if seconds is None or not entry_key.startswith(history):
        return None
    inverted = _TOP - 1 - seconds
    return (
        f"{recent_prefix(history)}{hour_of(seconds):0{_HOUR_DIGITS}d}/"
        f"{inverted:0{_SECOND_DIGITS}d}/{entry_key[len(history) :]}"
    )


def trim_op(history: str, at: str) -> Delete | None:
    """The prefix delete of the index's hour :data:`KEPT_HOURS` before ``at`` (pure)."""
    seconds = _seconds(at)
    if seconds is None:
        return None
    return Delete(_hour_prefix(history, hour_of(seconds) + KEPT_HOURS), prefix=True)


def _hour_prefix(history: str, hour: int) -> str:
    return f"{recent_prefix(history)}{hour:0{_HOUR_DIGITS}d}/"


def index_ops(history: str, at: str, entry_keys: Sequence[str], *, trim: bool) -> list[Op]:
    """The pointer to ``entry_keys`` (written together at ``at``), and the trim if ``trim``."""
    if not entry_keys:
        return []
    key = pointer_key(history, at, entry_keys[0])
    if key is None:
        return []
    others = "\n".join(k[len(history) :] for k in entry_keys[1:] if k.startswith(history))
    ops: list[Op] = [Put(key, others.encode())]
    cut = trim_op(history, at) if trim else None
    return ops if cut is None else [*ops, cut]


def entry_keys(history: str, pointer: KeyValue) -> list[str]:
    """The entry keys ``pointer`` names (pure); empty if it is not an index key."""
    parts = pointer.key[len(recent_prefix(history)) :].split("/", 2)
    if len(parts) != 3 or not pointer.key.startswith(recent_prefix(history)):
        return []
    try:
        others = pointer.value.decode() if pointer.value else ""
    except UnicodeDecodeError:
        others = ""
    return [f"{history}{path}" for path in (parts[2], *others.split("\n")) if path]


def second_prefix(history: str, pointer_key: str) -> str | None:
    """The prefix of every pointer of the same second as ``pointer_key`` (pure)."""
    parts = pointer_key[len(recent_prefix(history)) :].split("/", 2)
    if len(parts) != 3:
        return None
    return f"{recent_prefix(history)}{parts[0]}/{parts[1]}/"


def bucket_prefixes(history: str, now: int) -> list[str]:
    """The prefixes of the index's buckets a reader at ``now`` (seconds) reads, newest first:
    :data:`AHEAD_BUCKETS` ahead of it, then back over the hours the index keeps (pure)."""
    first = (_TOP - 1 - min(max(now, 0), _TOP - 1)) // BUCKET - AHEAD_BUCKETS
    count = AHEAD_BUCKETS + (KEPT_HOURS + 1) * (HOUR // BUCKET)
    prefix = recent_prefix(history)
    return [
        f"{prefix}{b * BUCKET // HOUR:0{_HOUR_DIGITS}d}/{b:0{_SECOND_DIGITS - 2}d}"
        for b in range(max(first, 0), first + count)
    ]


def stale_hours(history: str, keys: Sequence[str], now: int) -> list[Delete]:
    """Prefix deletes of every hour in ``keys`` (index keys) :data:`KEPT_HOURS` or more before
    ``now`` (seconds since the epoch): the hours no append trimmed (pure)."""
    oldest_kept = hour_of(now) + KEPT_HOURS
    prefix = recent_prefix(history)
    hours = set()
    for key in keys:
        segment = key[len(prefix) :].split("/", 1)[0]
        if segment.isdigit() and int(segment) >= oldest_kept:
            hours.add(int(segment))
    return [Delete(_hour_prefix(history, hour), prefix=True) for hour in sorted(hours)]
