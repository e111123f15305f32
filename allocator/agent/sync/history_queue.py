"""The agent's own history entries: queued by the loop, written by the store link.

The loop decides (a job falls back to the CPU, returns to its GPUs, is given
up on) and must never wait for the store, so it only queues the entry; the
link writes queued entries whenever it is connected, oldest first, each in a
transaction that compares the host's history head (see :mod:`allocator.history.append`).
An entry may carry a guard (:meth:`HistoryQueue.add` ``unless_ended_after``):
it is written only if the host's history does not already end that job's
holding (see :mod:`allocator.agent.sync.run_expiry`), checked after the
head is read, so a concurrent end makes the append's compare fail and the
check run again.
Nothing is lost silently: an entry stays queued through a store outage, and
only a queue full past :data:`MAX_PENDING` (a store away for very long while
GPUs flap) drops the oldest, with a log line saying how many.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from allocator.agent.sync.run_expiry import ended_after
from allocator.errors import BadRecord, CasConflict, PermissionDenied
from allocator.history.append import append_ops, read_head
from allocator.history.stream import OnBad, Stored, Stream, decode_entry, host_stream
from allocator.policy.model import HistorySettings
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Store

__all__ = ["MAX_PENDING", "PER_TICK", "HistoryQueue", "write_pending"]

#: Entries kept while the store cannot be written.
MAX_PENDING = 1000
#: Entries written per link tick, so a backlog never delays reads and keep-alives long.
PER_TICK = 16
#: Newest entries read to look for a holding's end before the whole stream is.
_NEWEST = 64
#: Tries per entry when another writer took the head meanwhile (each re-reads it).
_ATTEMPTS = 3

Log = Callable[[str, dict[str, Any]], None]
#: An entry, the history settings to keep, and its guard (the revision of the holding it ends).
Item = tuple[HistoryEntry, HistorySettings | None, int | None]


class HistoryQueue:
    """Entries waiting to be written, each with the history settings to keep (thread-safe)."""

    def __init__(self, log: Log, capacity: int = MAX_PENDING) -> None:
        self._log = log
        self._capacity = capacity
        self._lock = threading.Lock()
        self._items: deque[Item] = deque()
        self.dropped = 0

    def add(
        self,
        entries: Iterable[HistoryEntry],
        keep: HistorySettings | None,
        unless_ended_after: int | None = None,
    ) -> bool:
        """Queue ``entries``; return whether any was queued. Past capacity the oldest go.

        ``unless_ended_after``: an assignment's revision; each entry is then
        skipped if the history holds an end of its job written after it.
        """
        dropped: list[HistoryEntry] = []
        with self._lock:
            for entry in entries:
                self._items.append((entry, keep, unless_ended_after))
                if len(self._items) > self._capacity:
                    dropped.append(self._items.popleft()[0])
            queued = bool(self._items)
        if dropped:
            self.dropped += len(dropped)
            self._log(
                "history-dropped",
                {
                    "entries": len(dropped),
                    "oldest": f"{dropped[0].at} {dropped[0].action} {dropped[0].job}",
                    "reason": f"more than {self._capacity} entries waiting for the store",
                },
            )
        return queued

    def peek(self) -> Item | None:
        """The oldest entry waiting, or ``None``."""
        with self._lock:
            return self._items[0] if self._items else None

    def done(self, entry: HistoryEntry) -> None:
        """``entry`` (the oldest) is written or given up: take it off the queue."""
        with self._lock:
            if self._items and self._items[0][0] is entry:
                self._items.popleft()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def write_pending(
    store: Store, layout: KeyLayout, host: str, pending: HistoryQueue, log: Log
) -> int:
    """Write up to :data:`PER_TICK` queued entries, oldest first; return how many.

    A store error other than a refusal propagates (the entry stays queued,
    and the link treats the error as it treats any other); a refused
    permission drops the entry with a log line, since retrying cannot fix it
    and must not hold the link down.
    """
    stream = host_stream(layout, host)
    written = 0
    while written < PER_TICK and (item := pending.peek()) is not None:
        entry, keep, guard = item
        try:
            if not _append(store, stream, entry, keep, guard, log):
                return written  # the head kept moving: try again on the next tick
        except PermissionDenied as exc:
            log(
                "history-refused",
                {
                    "error": " ".join(str(exc).split()),
                    "entry": f"{entry.action} {entry.job}",
                    "hint": f"grant this agent write access to {layout.history}",
                },
            )
        pending.done(entry)
        written += 1
    return written


def _append(
    store: Store,
    stream: Stream,
    entry: HistoryEntry,
    keep: HistorySettings | None,
    guard: int | None,
    log: Log,
) -> bool:
    """Append ``entry`` (``True`` also when its guard says it is not needed)."""

    def bad(error: BadRecord) -> None:
        log("bad-record", {"key": error.key, "error": error.reason})

    for _ in range(_ATTEMPTS):
        head = read_head(store, stream, bad)  # before the check: an end after it moves the head
        if guard is not None and _ended(store, stream, entry, guard, bad):
            return True  # its end is recorded already: nothing to append
        compare, ops = append_ops(stream, head, entry, keep)
        try:
            store.txn([compare], ops)
            return True
        except CasConflict:
            continue
    return False


def _ended(store: Store, stream: Stream, entry: HistoryEntry, revision: int, on_bad: OnBad) -> bool:
    """Whether the stream ends ``entry``'s job's holding written at ``revision`` already."""
    return entry.job is not None and ended_after(
        _newest(store, stream, revision, on_bad), entry.job, revision
    )


def _newest(store: Store, stream: Stream, revision: int, on_bad: OnBad) -> list[Stored]:
    """The stream's entries written after ``revision``: its newest, or all if they all are."""
    listing = store.list(stream.prefix, limit=_NEWEST, descending=True)
    if len(listing.items) == _NEWEST and min(kv.mod_revision for kv in listing.items) > revision:
        listing = store.list(stream.prefix)
    found = []
    for item in listing.items:
        if item.mod_revision > revision:
            try:
                found.append(Stored(decode_entry(item, stream), item.mod_revision))
            except BadRecord as exc:
                on_bad(exc)
    return found
