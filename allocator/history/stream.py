"""Assignment history: who changed what, when and why, kept in the store itself.

Each host has a stream of entries, and so does the policy::

    /allocator/v1/history/heads/hosts/<host>      first and next sequence number, limit
    /allocator/v1/history/hosts/<host>/<seq>      one entry (seq zero-padded: key order)
    /allocator/v1/history/heads/policy
    /allocator/v1/history/policy/<seq>
    /allocator/v1/history/recent/<hour>/<second>/<stream>/<seq>   the fleet's index

This module names the streams and their keys, decodes their entries and
reads streams whole, and parses ``--since``. An entry is appended in the
same transaction as the change it records, bounded by the stream's limit
and age (:mod:`allocator.history.append`); the entries are ordinary
keys, not etcd's MVCC history, so compacting etcd loses none of them.
Reading newest first is :mod:`allocator.history.read`; what each
change records, :mod:`allocator.history.entries`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from allocator.errors import BadRecord, InvalidInput
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import KeyValue, Store
from allocator.util.times import parse_time

__all__ = [
    "ACTIONS",
    "OnBad",
    "Stored",
    "Stream",
    "decode_entry",
    "host_stream",
    "parse_since",
    "policy_stream",
    "read_history",
    "read_stream",
    "select",
]

_SEQ_DIGITS = 12

#: Every action an entry may record, and what it means.
ACTIONS = {
    "set": "a job was given GPUs (or the CPU) where it held nothing, or set again as it was",
    "move": "a job's GPUs changed",
    "release": "a job's assignment was removed",
    "expired": "the agent saw a job held by `allocator run` lose its GPUs by lease expiry",
    "fallback": "the agent moved a job off an unavailable GPU (to the CPU, or stopped it)",
    "recover": "the agent returned a job to its GPUs",
    "gave-up": "the agent stopped restarting a job (crash loop, or a `fail` fallback rule)",
    "failed": "a job across hosts ended in another share's crash: the job's result, GPUs kept",
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
    #: (:mod:`allocator.history.index`); empty: no pointers.
    root: str = ""

    def entry_key(self, seq: int) -> str:
        """Where entry ``seq`` lives (zero-padded, so key order is sequence order)."""
        return f"{self.prefix}{seq:0{_SEQ_DIGITS}d}"

    def seq_of(self, key: str) -> int | None:
        """The sequence number of entry key ``key`` of this stream; ``None``: not one."""
        tail = key[len(self.prefix) :]
        if len(tail) != _SEQ_DIGITS or not tail.isascii() or not tail.isdigit():
            return None
        return int(tail)


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
class Stored:
    """An entry as read, with the store revision that wrote it."""

    entry: HistoryEntry
    revision: int


OnBad = Callable[[BadRecord], None]


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
    seq = stream.seq_of(item.key)
    if seq is None:
        raise BadRecord(item.key, "not a history entry key (<prefix>/<12-digit sequence>)")
    entry = decode_record(item.value, HistoryEntry, item.key, host=stream.host)
    if entry.seq != seq:
        raise BadRecord(item.key, f"its seq {entry.seq} disagrees with the key")
    return entry


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
