"""Synchronous front, asyncio back: the plumbing an asyncio-only client needs.

:class:`LoopThread` runs a private event loop in a daemon thread and lets
ordinary threads run coroutines on it with a deadline. :class:`EventQueue`
carries watch events from the loop thread to whoever calls ``next()``; it
implements the blocking half of :class:`~allocator.store.base.Watch`.

No client library is imported here; the backend that uses these does that.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar, cast

from allocator.errors import AllocatorError, StoreError, StoreUnavailable
from allocator.store.base import Event

__all__ = ["EventQueue", "LoopThread", "SharedLoop"]

_T = TypeVar("_T")


class LoopThread:
    """A private asyncio loop in a daemon thread; other threads submit coroutines to it.

    Submissions wait in a list that the loop takes whole: a thread that
    submits while an earlier hand-over is still unclaimed does not wake the
    loop again (8 threads calling at once cost the loop one wake-up, not 8),
    and each caller waits on a bare lock rather than a
    :class:`concurrent.futures.Future`.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._submitted: list[_Call[Any]] = []
        self._wake_pending = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            with self._lock:
                self._closed = True
                orphans, self._submitted = self._submitted, []
            for call in orphans:
                call.refuse()
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
        call = _Call(coro)
        with self._lock:
            closed = self._closed
            if not closed:
                self._submitted.append(call)
                wake, self._wake_pending = not self._wake_pending, True
        if closed:
            coro.close()
            raise StoreError(f"store for {where} is closed")
        if wake:
            # Closed in between: _run's clean-up has refused the call.
            self.call_soon(self._start_submitted)
        if not call.done.acquire(timeout=timeout):
            self.call_soon(call.abandon)
            if timeout_error is not None:
                raise timeout_error
            raise StoreUnavailable(f"{where} did not answer within {timeout:g} s")
        if call.cancelled:
            raise StoreError(f"store for {where} was closed during the call")
        if call.error is not None:
            raise call.error
        return cast("_T", call.result)

    def _start_submitted(self) -> None:
        with self._lock:
            calls, self._submitted = self._submitted, []
            self._wake_pending = False
        for call in calls:
            call.start(self.loop)

    def call_soon(self, callback: Any, *args: Any) -> None:
        """Schedule ``callback(*args)`` on the loop; ignored once the loop is closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(callback, *args)

    def stop(self, timeout: float) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for the thread to end."""
        self.call_soon(self.loop.stop)
        self._thread.join(timeout)


class SharedLoop:
    """One :class:`LoopThread` for every user in the process, started by the first.

    Stores of one process share it, as the clients of one asyncio program
    share its loop: threads calling on several stores at once then cost one
    wake-up of one thread, not one per store. It stops when its last user
    releases it (a closed store leaves no thread behind), and a forked child
    starts its own.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._users = 0
        os.register_at_fork(after_in_child=self._forget)

    def acquire(self) -> LoopThread:
        """The running loop thread (started if none runs); pair with :meth:`release`."""
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread(self.name)
            self._users += 1
            return self._loop

    def release(self, loop: LoopThread, timeout: float) -> None:
        """One user is done with ``loop``; the last one stops it (waiting up to ``timeout`` s)."""
        with self._lock:
            if loop is not self._loop:
                return  # from before a fork
            self._users -= 1
            if self._users > 0:
                return
            self._loop = None
        loop.stop(timeout)

    def _forget(self) -> None:
        # The parent's loop thread does not exist in a forked child.
        self._lock = threading.Lock()
        self._loop = None
        self._users = 0


class _Call(Generic[_T]):
    """One submitted coroutine: its task once started, and its outcome for the caller."""

    __slots__ = ("abandoned", "cancelled", "coro", "done", "error", "result", "task")

    def __init__(self, coro: Coroutine[Any, Any, _T]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()  # released once the outcome is in
        self.task: asyncio.Task[_T] | None = None
        self.result: _T | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.abandoned = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: run the coroutine as a task (unless its caller gave up already)."""
        if self.abandoned:
            self.coro.close()
            return
        self.task = loop.create_task(self.coro)
        self.task.add_done_callback(self._finish)

    def _finish(self, task: asyncio.Task[_T]) -> None:
        if task.cancelled():
            self.cancelled = True
        elif (error := task.exception()) is not None:
            self.error = error
        else:
            self.result = task.result()
        self.done.release()

    def abandon(self) -> None:
        """On the loop: the caller stopped waiting; cancel the task."""
        self.abandoned = True
        if self.task is not None:
            self.task.cancel()

    def refuse(self) -> None:
        """The loop ended before the call started: it fails as cancelled."""
        self.coro.close()
        self.cancelled = True
        self.done.release()


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
