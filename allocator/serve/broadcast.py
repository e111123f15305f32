"""The page's live updates: a snapshot, then each change once, shared by every event stream.

A stream's first event is ``fleet``, the whole document (or the fleet's
grid, for the page: ``?snapshot=grid``); after it each
change is one ``hosts`` event, the changed hosts' parts (built once per
change by :class:`Broadcaster` and the same bytes handed to every stream).
A stream that falls :data:`BACKLOG` changes behind, or any stream when
every host was rebuilt, gets ``resync``: fetch the whole document again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

__all__ = ["BACKLOG", "KEEPALIVE_SECONDS", "REFRESH_SECONDS", "Broadcaster", "event_stream"]

#: A comment line on idle event streams, so proxies do not close them.
KEEPALIVE_SECONDS = 15.0
#: Hosts whose status moves with time alone are looked at this often even without a change.
REFRESH_SECONDS = 30.0
#: Changes a stream may have waiting before it is told to resync instead.
BACKLOG = 64
#: Changes arriving this close together are sent as one.
_DEBOUNCE_SECONDS = 0.05

_RESYNC = b"event: resync\ndata: {}\n\n"
#: What a stream's queue gets when the server stops.
_END = b""


class Broadcaster:
    """Each change once, queued to every open stream (at most :data:`BACKLOG` each).

    ``snapshot()`` is a stream's whole first document, in pieces; ``change()`` the
    hosts changed since its last call (``None``: every host was rebuilt).
    """

    def __init__(
        self, snapshot: Callable[[], Iterator[bytes]], change: Callable[[], bytes | None]
    ) -> None:
        self.snapshot = snapshot
        self._change = change
        self._dirty = asyncio.Event()
        self._queues: set[asyncio.Queue[bytes]] = set()
        self.closed = False

    def poke(self) -> None:
        """Something changed (call on the event loop)."""
        self._dirty.set()

    def join(self) -> asyncio.Queue[bytes]:
        """A stream opens: the queue its changes come in (take its snapshot after joining)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue(BACKLOG)
        self._queues.add(queue)
        return queue

    def leave(self, queue: asyncio.Queue[bytes]) -> None:
        """A stream ends."""
        self._queues.discard(queue)

    async def run(self) -> None:
        """Send each change (debounced), and look at least every :data:`REFRESH_SECONDS`.

        Changes are taken with no stream open too, so a stream that opens
        later is not sent what its snapshot already holds.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), REFRESH_SECONDS)
            await asyncio.sleep(_DEBOUNCE_SECONDS)
            self._dirty.clear()
            change = await asyncio.to_thread(self._change)
            self.send(_RESYNC if change is None else b"event: hosts\ndata: " + change + b"\n\n")

    def send(self, event: bytes) -> None:
        """``event`` to every stream; a stream whose queue is full is told to resync."""
        for queue in self._queues:
            if queue.full():
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(_RESYNC)
            else:
                queue.put_nowait(event)

    async def close(self) -> None:
        """End every open stream (the server is stopping)."""
        self.closed = True
        for queue in self._queues:
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(_END)


async def event_stream(
    broadcaster: Broadcaster,
    disconnected: Callable[[], Awaitable[bool]],
    snapshot: Callable[[], Iterator[bytes]] | None = None,
) -> AsyncIterator[bytes]:
    """One viewer's events until it goes (``disconnected()``) or the server stops.

    ``snapshot``: the first document, when not the broadcaster's (the page's grid).
    """
    queue = broadcaster.join()
    try:
        yield b"event: fleet\ndata: "
        pieces = (snapshot or broadcaster.snapshot)()
        while (piece := await asyncio.to_thread(next, pieces, b"")) != b"":
            yield piece  # sent as it is made: a fleet's document is never whole in memory
        yield b"\n\n"
        while not broadcaster.closed and not await disconnected():
            try:
                event = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if event == _END or broadcaster.closed:
                return
            yield event
            if event == _RESYNC:
                return  # the viewer fetches the whole document again (a new stream)
    finally:
        broadcaster.leave(queue)
