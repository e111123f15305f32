"""The fleet's index of recent history entries: newest first by key.

Every append also writes one small pointer key, in the same transaction::

    /allocator/v1/history/recent/<hour>/<ms>/hosts/<host>/<seq>
    /allocator/v1/history/recent/<hour>/<ms>/policy/<seq>

``<ms>`` is ``10**13`` minus the entry's time in milliseconds (the writer's
clock) and ``<hour>`` the same, in hours: both count down, so the newest
pointer is the *first* key of the prefix. A fleet-wide ``history --limit 20``
is then one ascending range read with a limit (etcd stops after that many
keys, however large the index) and one batched read of the entries the
pointers name (:func:`read_recent`); it never ranks 12,500 heads. The
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
to ranking the streams' heads (:mod:`allocator.control.history_read`), as it
does when the index holds fewer entries than asked for (a quiet fleet, or
entries written by a version without the index).
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.store import Delete, KeyValue, Op, Put
from allocator.util.times import parse_time

__all__ = [
    "HOUR_MS",
    "KEPT_HOURS",
    "entry_keys",
    "hour_of",
    "index_ops",
    "pointer_key",
    "stale_hours",
    "trim_op",
]

#: One bucket of the index (its ``<hour>`` segment).
HOUR_MS = 3_600_000
#: An append deletes the hour this many before its own: the index keeps the hours between.
KEPT_HOURS = 2
_MS_DIGITS = 13
_TOP = 10_000_000_000_000  # 10**13: a millisecond count until the year 2286
_HOUR_DIGITS = 7


def recent_prefix(history: str) -> str:
    """The index's prefix below ``history`` (the layout's ``history``)."""
    return f"{history}recent/"


def _millis(at: str) -> int | None:
    moment = parse_time(at)
    if moment is None or moment.tzinfo is None:
        return None
    return min(max(int(moment.timestamp() * 1000), 0), _TOP - 1)


def hour_of(millis: int) -> int:
    """The ``<hour>`` bucket of a time in milliseconds (counts down: newer is smaller)."""
    return (_TOP - 1 - millis) // HOUR_MS


def pointer_key(history: str, at: str, entry_key: str) -> str | None:
    """The index key for the entry at ``entry_key`` written at ``at`` (pure).

    ``None`` for an unreadable time (no entry this code builds has one).
    """
    millis = _millis(at)
    if millis is None or not entry_key.startswith(history):
        return None
    inverted = _TOP - 1 - millis
    return (
        f"{recent_prefix(history)}{hour_of(millis):0{_HOUR_DIGITS}d}/"
        f"{inverted:0{_MS_DIGITS}d}/{entry_key[len(history) :]}"
    )


def trim_op(history: str, at: str) -> Delete | None:
    """The prefix delete of the index's hour :data:`KEPT_HOURS` before ``at`` (pure)."""
    millis = _millis(at)
    if millis is None:
        return None
    return Delete(_hour_prefix(history, hour_of(millis) + KEPT_HOURS), prefix=True)


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


def stale_hours(history: str, keys: Sequence[str], now_millis: int) -> list[Delete]:
    """Prefix deletes of every hour in ``keys`` (index keys) :data:`KEPT_HOURS` or more before
    ``now_millis``: the hours no append trimmed (pure)."""
    oldest_kept = hour_of(now_millis) + KEPT_HOURS
    prefix = recent_prefix(history)
    hours = set()
    for key in keys:
        segment = key[len(prefix) :].split("/", 1)[0]
        if segment.isdigit() and int(segment) >= oldest_kept:
            hours.add(int(segment))
    return [Delete(_hour_prefix(history, hour), prefix=True) for hour in sorted(hours)]
