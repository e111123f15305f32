"""One etcd call on an asyncio loop: its budget, its endpoints, its login.

The gRPC backend (:mod:`allocator.store.etcd.grpc_backend`) runs every call through
:class:`EndpointCalls`, which holds the connection to the current endpoint
and decides, with :mod:`allocator.store.etcd.rules`, what a failure means:

* the whole call, failovers included, fits in ``config.timeout``; each
  endpoint gets an equal share of what is left, and the share is the
  deadline every request of the attempt carries (:func:`remaining`);
* a call the current endpoint could not take is tried on the next one:
  any ``idempotent`` call, and any other only when it cannot have been
  applied (no connection, no leader); a write that was sent but not
  answered raises :class:`~allocator.errors.AmbiguousWrite`;
* a stale login is renewed once, as etcd's own client does.

Generic over the connection; the client library's errors are read through
the ``status_of`` and ``translate`` functions the backend passes in, so no
client library is imported here.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from allocator.errors import AllocatorError
from allocator.store.etcd.config import EtcdConfig
from allocator.store.etcd.rules import (
    ambiguous_write,
    attempt_timeout,
    maybe_applied,
    token_is_stale,
    worth_another_endpoint,
)

__all__ = ["Connection", "EndpointCalls", "StatusOf", "remaining"]

_T = TypeVar("_T")
# When the current attempt must be done by (loop time); each call is its own task.
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("etcd_call_deadline")


def remaining() -> float:
    """Seconds left before the current attempt's deadline (at least a millisecond)."""
    return max(_DEADLINE.get() - asyncio.get_running_loop().time(), 0.001)


class Connection(Protocol):
    """A connection to one endpoint, as :class:`EndpointCalls` uses it."""

    endpoint: str

    async def authenticate(self) -> None:
        """Log in (get a fresh token) if the configuration names a user."""
        ...

    def ready(self) -> bool:
        """Whether requests can have gone out on it (it is connected)."""
        ...

    async def close(self) -> None:
        """Close it."""
        ...


_C = TypeVar("_C", bound=Connection)
StatusOf = Callable[[BaseException], "tuple[int, str] | None"]


class EndpointCalls(Generic[_C]):
    """The current connection, and how one call is run on it (see the module doc)."""

    def __init__(
        self,
        config: EtcdConfig,
        connect: Callable[[int], _C],
        status_of: StatusOf,
        translate: Callable[[BaseException, str], AllocatorError],
    ) -> None:
        self.config = config
        self.endpoints = config.endpoint_names
        self.current: _C | None = None
        self._connect = connect
        self._status_of = status_of
        self._translate = translate
        self._index = 0
        self._lock = asyncio.Lock()

    async def run(self, op: Callable[[_C], Awaitable[_T]], idempotent: bool) -> _T:
        """Run ``op`` against the current connection within the call's budget."""
        loop = asyncio.get_running_loop()
        overall = loop.time() + self.config.timeout
        count = len(self.config.endpoints)
        for tried in range(1, count + 1):
            share = attempt_timeout(overall - loop.time(), count - tried + 1)
            _DEADLINE.set(loop.time() + share)
            conn: _C | None = None
            connected = False
            try:
                conn = await self._connection()
                connected = conn.ready()
                return await self._with_fresh_token(conn, op)
            except AllocatorError:
                raise
            except Exception as exc:
                where = conn.endpoint if conn is not None and tried == 1 else self.endpoints
                # A request goes out only on a ready connection: one that never got
                # there cannot have delivered the write.
                sent = conn is not None and (connected or conn.ready())
                status = self._status_of(exc)
                timed_out = isinstance(exc, TimeoutError | asyncio.CancelledError)
                if sent and not idempotent and (timed_out or _maybe(status)):
                    raise ambiguous_write(where, self.config.timeout) from exc
                retry = status is not None and worth_another_endpoint(
                    *status, idempotent or not sent
                )
                if tried == count or not retry:
                    raise self._translate(exc, where) from exc
                await self.next_endpoint(conn)
        raise AssertionError("every attempt returns or raises")

    async def _with_fresh_token(self, conn: _C, op: Callable[[_C], Awaitable[_T]]) -> _T:
        try:
            return await op(conn)
        except Exception as exc:
            # A refused watch reports a stale token as its cancel reason, hence str(exc).
            status = self._status_of(exc)
            text = status[1] if status is not None and status[1] else str(exc)
            if not token_is_stale(text) or self.config.username is None:
                raise
        await conn.authenticate()
        return await op(conn)

    async def _connection(self) -> _C:
        async with self._lock:
            if self.current is None:
                conn = self._connect(self._index)
                try:
                    await conn.authenticate()
                except BaseException:
                    await conn.close()
                    raise
                self.current = conn
            return self.current

    async def next_endpoint(self, failed: _C | None) -> None:
        """Drop ``failed`` (if it is still the current connection) and move to the next endpoint."""
        async with self._lock:
            if failed is not None and self.current is failed:
                self.current = None
                await failed.close()
            self._index = (self._index + 1) % len(self.config.endpoints)

    async def close(self) -> None:
        """Close the current connection."""
        async with self._lock:
            conn, self.current = self.current, None
        if conn is not None:
            await conn.close()


def _maybe(status: tuple[int, str] | None) -> bool:
    return status is not None and maybe_applied(*status)
