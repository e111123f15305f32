"""The page's live updates: one document per change, shared by every event stream.

:class:`Broadcaster` builds the document once per change (debounced) and
hands the same bytes to every open stream; :func:`event_stream` is one
stream's server-sent events, with a keep-alive comment while nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["KEEPALIVE_SECONDS", "REFRESH_SECONDS", "Broadcaster", "event_stream"]

#: A comment line on idle event streams, so proxies do not close them.
KEEPALIVE_SECONDS = 15.0
#: The page's document is rebuilt this often even without a change (times move on).
REFRESH_SECONDS = 30.0
#: Changes arriving this close together are shown once.
_DEBOUNCE_SECONDS = 0.05


class Broadcaster:
    """One document per change, shared by every event stream (the latest only, no backlog).

    Nothing is built while no stream is open: a fleet's document is megabytes.
    """

    def __init__(self, build: Callable[[], bytes]) -> None:
        self._build = build
        self.version = 0
        self.payload = b""
        self._dirty = asyncio.Event()
        self._ready = asyncio.Condition()
        self._wanted = asyncio.Event()
        self._streams = 0
        self.closed = False

    def poke(self) -> None:
        """Something changed (call on the event loop)."""
        self._dirty.set()

    def join(self) -> int:
        """A stream opens: the version it has seen (the next one is built for it)."""
        self._streams += 1
        self._wanted.set()
        self.poke()
        return self.version

    def leave(self) -> None:
        """A stream ends."""
        self._streams -= 1
        if not self._streams:
            self._wanted.clear()

    async def run(self, warm: Callable[[], None] = lambda: None) -> None:
        """Rebuild on each change (debounced) and at least every :data:`REFRESH_SECONDS`.

        With no stream open, ``warm()`` instead: what the document is made
        from is brought up to date, so the API's next answer need not.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), REFRESH_SECONDS)
            await asyncio.sleep(_DEBOUNCE_SECONDS)
            self._dirty.clear()
            if not self._wanted.is_set():
                await asyncio.to_thread(warm)
                continue
            payload = await asyncio.to_thread(self._build)
            async with self._ready:
                self.version += 1
                self.payload = payload
                self._ready.notify_all()

    async def close(self) -> None:
        """End every stream waiting in :meth:`next` (the server is stopping)."""
        async with self._ready:
            self.closed = True
            self._ready.notify_all()

    async def next(self, seen: int, timeout: float) -> tuple[int, bytes] | None:
        """The newest document after version ``seen``, or ``None`` after ``timeout`` seconds."""
        async with self._ready:
            if self.version == seen and not self.closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready.wait(), timeout)
            if self.version == seen:
                return None
            return self.version, self.payload


async def event_stream(
    broadcaster: Broadcaster, disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[bytes]:
    """One viewer's ``fleet`` events until it goes (``disconnected()``) or the server stops."""
    seen = broadcaster.join()
    try:
        while not broadcaster.closed and not await disconnected():
            found = await broadcaster.next(seen, KEEPALIVE_SECONDS)
            if broadcaster.closed:
                return
            if found is None:
                yield b": keep-alive\n\n"
                continue
            seen, payload = found
            yield b"event: fleet\ndata: " + payload + b"\n\n"
    finally:
        broadcaster.leave()
