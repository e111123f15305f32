"""The SQLite store's watch: asleep while nothing changes, awake at once when the file does.

Polling the store's revision every 25 ms cost an idle agent over 1 % of a
core. Every commit writes the store's files (the ``-wal`` log, or the
database file itself once checkpointed), so on Linux the watch sleeps on
``inotify`` events for those files and reads the store only when one
comes; a read-only user can watch, since only the directory must be
readable. What ``inotify`` cannot see is covered by a slow re-check (lease
expiry written by nobody, a missed event): at least every
``MAX_SLEEP_S``. Without ``inotify`` (another system, or the per-user limit
of instances reached) the watch polls, fast after a change and backing off
to ``MAX_SLEEP_S`` while nothing happens.

A file event can arrive a moment before the commit it belongs to is
visible (the log is written before its index is updated), so an event that
shows nothing new is followed by a few quick re-reads before sleeping again.
Those re-reads still listen for file events: any write to the store (the
agent's own records, another prefix's keys) starts them, and a commit
landing during one must be read at once, not after the step's sleep.
"""

from __future__ import annotations

import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from allocator.store.base import Event

__all__ = ["MAX_SLEEP_S", "FileChanges", "Poll", "SqliteWatch", "backoff"]

#: The longest a watch sleeps without reading the store.
MAX_SLEEP_S = 1.0
#: Re-reads after a file event that showed nothing new yet (seconds after it).
_SETTLE_S = (0.002, 0.005, 0.01, 0.025, 0.05)

# <sys/inotify.h>
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
_IN_Q_OVERFLOW = 0x4000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")

#: ``poll(cursor)`` returns the events from revision ``cursor`` on and the next cursor.
Poll = Callable[[int], tuple[list[Event], int]]


def backoff(interval: float, fastest: float) -> float:
    """The next polling interval after a quiet poll: doubled, at most ``MAX_SLEEP_S``."""
    return min(max(interval * 2, fastest), MAX_SLEEP_S)


class FileChanges:
    """``inotify`` on the directory of ``path``, reporting writes to ``path`` and its ``-wal``.

    :meth:`open` returns ``None`` where ``inotify`` is not available.
    """

    def __init__(self, fd: int, names: frozenset[bytes]) -> None:
        self._fd = fd
        self._names = names
        self._wake_r, self._wake_w = os.pipe()
        self._closing = False
        # Held while waiting: close() wakes the waiter, then waits for it to let go
        # before closing the descriptors it may be selecting on.
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> FileChanges | None:
        """Watch ``path``'s files, or ``None`` if this system cannot (then poll)."""
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError):  # not Linux
            return None
        fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
        if fd < 0:  # EMFILE: the per-user limit of inotify instances
            return None
        mask = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE
        if add(fd, os.fsencode(path.parent), mask) < 0:  # the directory is missing
            os.close(fd)
            return None
        name = os.fsencode(path.name)
        return cls(fd, frozenset({name, name + b"-wal"}))

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; whether the store's files were written.

        Returns early (``False``) when :meth:`close` is called.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready, _, _ = select.select([self._fd, self._wake_r], [], [], remaining)
                if self._wake_r in ready or not ready:
                    return False
                if self._drain():
                    return True
        return False

    def _drain(self) -> bool:
        """Read the pending events; whether one was about the store's files."""
        touched = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return touched
            except OSError:
                return True  # cannot tell: let the caller read the store
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                touched = touched or bool(mask & _IN_Q_OVERFLOW) or name in self._names
                offset += _EVENT.size + length

    def close(self) -> None:
        """Stop watching; a :meth:`wait` in another thread returns. Idempotent."""
        if self._closing:
            return
        self._closing = True
        os.write(self._wake_w, b"x")
        with self._lock:
            for fd in (self._fd, self._wake_r, self._wake_w):
                os.close(fd)


class SqliteWatch:
    """A watch that reads the store only when its files change (see the module doc).

    ``changes`` is ``None`` where ``inotify`` is unavailable: then it polls
    every ``fastest`` seconds after a change, backing off while idle.
    """

    def __init__(
        self,
        poll: Poll,
        cursor: int,
        changes: FileChanges | None,
        fastest: float,
        settle: tuple[float, ...] = _SETTLE_S,
    ) -> None:
        self._poll = poll
        self._settle = settle
        self._cursor = cursor
        self._changes = changes
        self._fastest = fastest
        self._interval = fastest
        self._closed = threading.Event()

    def next(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds; return the next batch of events."""
        deadline = time.monotonic() + max(timeout, 0.0)
        settle: tuple[float, ...] = ()
        while not self._closed.is_set():
            events, self._cursor = self._poll(self._cursor)
            if events:
                self._interval = self._fastest
                return events
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if settle and self._changes is not None:
                # A file event showed nothing yet: look again shortly, or at once on the
                # next file event (a commit landing meanwhile must not wait out the step).
                woke = self._changes.wait(min(settle[0], remaining))
                settle = self._settle if woke else settle[1:]
            elif self._changes is not None:
                if self._changes.wait(min(MAX_SLEEP_S, remaining)):
                    settle = self._settle
            else:
                # Waiting on the event (not time.sleep) lets close() end a wait early.
                self._closed.wait(min(self._interval, remaining))
                self._interval = backoff(self._interval, self._fastest)
        return []

    def close(self) -> None:
        """Stop watching; a ``next`` waiting in another thread returns ``[]``."""
        self._closed.set()
        if self._changes is not None:
            self._changes.close()
