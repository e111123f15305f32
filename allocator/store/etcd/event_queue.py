"""The blocking half of a watch: batches of events in from a reader thread, ``next()`` out.

A watch's reader thread (:mod:`allocator.store.etcd.watch`) puts each batch
here, or the error that ended the stream; whoever holds the
:class:`~allocator.store.base.Watch` takes them with a timeout.
"""

from __future__ import annotations

import threading

from allocator.errors import AllocatorError, StoreError
from allocator.store.base import Event

__all__ = ["EventQueue"]


class EventQueue:
    """Batches of events in, ``next()`` out; an error or ``close()`` ends it.

    ``put`` and ``fail`` may be called from any thread. Events queued before
    an error are still delivered; the error is raised once they are taken,
    and again on every later ``next()``. After ``close()``, ``next()`` raises
    ``StoreError`` (a consumer must not spin on a closed watch).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: list[Event] = []
        self._error: AllocatorError | None = None
        self._closed = False

    def put(self, events: list[Event]) -> None:
        """Append one batch (one revision, or several in order)."""
        with self._cond:
            if self._error is None and not self._closed:
                self._events.extend(events)
                self._cond.notify_all()

    def fail(self, error: AllocatorError) -> None:
        """End the stream with ``error`` (the first error wins)."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def close(self) -> bool:
        """Mark closed and wake any waiter; return False if it already was."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._cond.notify_all()
            return True

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def next(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds for events; ``[]`` if none came."""
        with self._cond:
            self._cond.wait_for(self._ready, timeout)
            if self._closed:
                raise StoreError("the watch is closed")
            if self._events:
                batch, self._events = self._events, []
                return batch
            if self._error is not None:
                raise self._error
            return []

    def _ready(self) -> bool:
        return bool(self._events) or self._error is not None or self._closed
