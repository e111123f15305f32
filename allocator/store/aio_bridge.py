"""Synchronous front, asyncio back: the plumbing an asyncio-only client needs.

:class:`LoopThread` runs a private event loop in a daemon thread and lets
ordinary threads run coroutines on it with a deadline. :class:`EventQueue`
carries watch events from the loop thread to whoever calls ``next()``; it
implements the blocking half of :class:`~allocator.store.base.Watch`.

No client library is imported here; the backend that uses these does that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from allocator.errors import AllocatorError, StoreError, StoreUnavailable
from allocator.store.base import Event

__all__ = ["EventQueue", "LoopThread"]

_T = TypeVar("_T")


class LoopThread:
    """A private asyncio loop in a daemon thread; other threads submit coroutines to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Cancel and await what is left, so nothing is reported as
            # "destroyed but pending" or "never awaited" (tests run -W error).
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def run(
        self,
        coro: Coroutine[Any, Any, _T],
        timeout: float,
        where: str,
        *,
        timeout_error: AllocatorError | None = None,
    ) -> _T:
        """Run ``coro`` on the loop and return its result.

        Raises ``timeout_error`` (default: ``StoreUnavailable`` naming
        ``where``) if it takes longer than ``timeout`` seconds (the coroutine
        is then cancelled), and ``StoreError`` if the loop has been stopped.
        """
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise StoreError(f"store for {where} is closed") from None
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            if timeout_error is not None:
                raise timeout_error from None
            raise StoreUnavailable(f"{where} did not answer within {timeout:g} s") from None
        except concurrent.futures.CancelledError:
            raise StoreError(f"store for {where} was closed during the call") from None

    def call_soon(self, callback: Any, *args: Any) -> None:
        """Schedule ``callback(*args)`` on the loop; ignored once the loop is closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout: float) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for the thread to end."""
        self.call_soon(self.loop.stop)
        self._thread.join(timeout)


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
