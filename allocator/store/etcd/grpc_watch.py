"""A gRPC watch stream of etcd, fed into a queue that ``Watch.next()`` reads.

:func:`pump_watch` drives one bidirectional watch stream on the gRPC
backend's loop: it sends the create request, turns every response into
events (or the error that ends the watch) and puts them on an
:class:`~allocator.store.etcd.grpc_bridge.EventQueue`. Every way a stream can end
(refused, compacted, cancelled, its channel closed under it) reaches
``next()`` as an error. The backend passes in how to read a response and
how to translate its client library's errors, so none is imported here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from allocator.errors import AllocatorError, Compacted, StoreUnavailable
from allocator.store.base import Event, Watch
from allocator.store.etcd.grpc_bridge import EventQueue

__all__ = ["EtcdWatch", "WatchReply", "pump_watch"]

#: What one response says: its events, the error that ends the watch, whether it is created.
WatchReply = tuple[list[Event], AllocatorError | None, bool]


async def pump_watch(
    call: Any,
    create: Any,
    read: Callable[[Any], WatchReply],
    translate: Callable[[BaseException], AllocatorError],
    where: str,
    queue: EventQueue,
    created: asyncio.Future[None],
) -> None:
    """Feed the watch stream ``call`` into ``queue`` until it ends; every ending is an error.

    ``created`` resolves once the server has the watch, or carries the error
    that refused it (a compacted start revision is left for ``next()``).
    """
    try:
        await call.write(create)
        async for response in call:
            events, error, is_created = read(response)
            if error is not None:
                _settle(created, None if isinstance(error, Compacted) else error)
                queue.fail(error)
                return
            if is_created:
                _settle(created, None)
            if events:
                queue.put(events)
    except Exception as exc:
        _settle(created, exc)  # raw, so the caller can fail over or log in again
        queue.fail(translate(exc))
    finally:
        _settle(created, None)
        call.cancel()
        # However the stream ended (cleanly, or its channel was closed under
        # it), next() must say so; the first error recorded wins.
        queue.fail(StoreUnavailable(f"etcd at {where}: the watch stream ended"))


def _settle(created: asyncio.Future[None], error: BaseException | None) -> None:
    if created.done():
        return
    if error is None:
        created.set_result(None)
    else:
        created.set_exception(error)


class EtcdWatch:
    """A prefix watch; see :class:`~allocator.store.base.Watch`.

    ``stop`` cancels the stream's task (on the loop); ``forget`` tells the
    store the watch is closed.
    """

    def __init__(
        self,
        queue: EventQueue,
        stop: Callable[[], None],
        forget: Callable[[EtcdWatch], None],
    ) -> None:
        self.queue = queue
        self._stop = stop
        self._forget = forget

    def next(self, timeout: float) -> list[Event]:
        """Return the next batch of events, or ``[]`` after ``timeout`` seconds."""
        return self.queue.next(timeout)

    def close(self) -> None:
        """Stop watching (the stream is cancelled). Idempotent."""
        if self.queue.close():
            self._forget(self)
            self._stop()


if TYPE_CHECKING:  # mypy checks the class against the protocol
    _WATCH: type[Watch] = EtcdWatch
