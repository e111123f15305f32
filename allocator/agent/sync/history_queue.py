"""The agent's own history entries: queued by the loop, written by the store link.

The loop decides (a job falls back to the CPU, returns to its GPUs, is given
up on) and must never wait for the store, so it only queues the entry; the
link writes queued entries whenever it is connected, oldest first, each in a
transaction that compares the host's history head (see :mod:`allocator.control.history`).
Nothing is lost silently: an entry stays queued through a store outage, and
only a queue full past :data:`MAX_PENDING` (a store away for very long while
GPUs flap) drops the oldest, with a log line saying how many.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from allocator.control.history import Stream, host_stream, prepare_append
from allocator.errors import BadRecord, CasConflict, PermissionDenied
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Store

__all__ = ["MAX_PENDING", "PER_TICK", "HistoryQueue", "write_pending"]

#: Entries kept while the store cannot be written.
MAX_PENDING = 1000
#: Entries written per link tick, so a backlog never delays reads and keep-alives long.
PER_TICK = 16
#: Tries per entry when another writer took the head meanwhile (each re-reads it).
_ATTEMPTS = 3

Log = Callable[[str, dict[str, Any]], None]


class HistoryQueue:
    """Entries waiting to be written, each with the history limit to keep (thread-safe)."""

    def __init__(self, log: Log, capacity: int = MAX_PENDING) -> None:
        self._log = log
        self._capacity = capacity
        self._lock = threading.Lock()
        self._items: deque[tuple[HistoryEntry, int | None]] = deque()
        self.dropped = 0

    def add(self, entries: Iterable[HistoryEntry], limit: int | None) -> bool:
        """Queue ``entries``; return whether any was queued. Past capacity the oldest go."""
        dropped: list[HistoryEntry] = []
        with self._lock:
            for entry in entries:
                self._items.append((entry, limit))
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

    def peek(self) -> tuple[HistoryEntry, int | None] | None:
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
        entry, limit = item
        try:
            if not _append(store, stream, entry, limit, log):
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


def _append(store: Store, stream: Stream, entry: HistoryEntry, limit: int | None, log: Log) -> bool:
    def bad(error: BadRecord) -> None:
        log("bad-record", {"key": error.key, "error": error.reason})

    for _ in range(_ATTEMPTS):
        compare, ops = prepare_append(store, stream, entry, limit, bad)
        try:
            store.txn([compare], ops)
            return True
        except CasConflict:
            continue
    return False
