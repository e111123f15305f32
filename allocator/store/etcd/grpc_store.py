"""The synchronous :class:`~allocator.store.base.Store` front of the gRPC etcd backend.

The stores of a process share one asyncio loop in a thread (the client
library is asyncio-only; :class:`~allocator.store.etcd.grpc_bridge.SharedLoop`);
every call is a coroutine run on it through
:class:`~allocator.store.etcd.grpc_calls.EndpointCalls` (budget, failover,
login renewal). What a call does on the wire is the connection's business:
:mod:`allocator.store.etcd.grpc_backend` builds connections whose methods speak gRPC, and
is the only module that imports the client library. Arguments are checked
here, before anything is sent.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from allocator.errors import AllocatorError, StoreError
from allocator.store.base import (
    Compare,
    Delete,
    KeyValue,
    Listing,
    Op,
    Put,
    Read,
    Store,
    TxnOutcome,
)
from allocator.store.etcd.config import EtcdConfig
from allocator.store.etcd.grpc_bridge import EventQueue, SharedLoop
from allocator.store.etcd.grpc_calls import EndpointCalls, StatusOf
from allocator.store.etcd.grpc_watch import EtcdWatch
from allocator.store.etcd.rules import MAX_TXN_OPS, ambiguous_write
from allocator.store.local import (
    check_key,
    check_prefix,
    check_reads,
    check_ttl,
    check_txn,
    check_value,
    lease_of,
)
from allocator.store.urls import redact_url

__all__ = ["EtcdConnection", "EtcdStore"]

#: Seconds past a call's budget before the loop thread gives up on it: a
#: hang guard only, since every request carries a deadline inside the budget.
_GUARD_SLACK_S = 1.0
_T = TypeVar("_T")
#: Every store of the process runs its calls on this one loop thread.
_LOOP = SharedLoop("allocator-etcd")


class EtcdConnection(Protocol):
    """One connection to one endpoint, speaking etcd's API in allocator's terms."""

    endpoint: str

    async def authenticate(self) -> None:
        """Log in (get a fresh token) if the configuration names a user."""
        ...

    def ready(self) -> bool:
        """Whether requests can have gone out on it (it is connected)."""
        ...

    async def close(self) -> None:
        """Close it (its calls and watches end)."""
        ...

    async def get(self, key: str) -> KeyValue | None:
        """The current version of ``key``."""
        ...

    async def list(self, prefix: str) -> Listing:
        """Every key under ``prefix``, sorted, in one range read."""
        ...

    async def put(self, key: str, value: bytes, lease: int | None) -> int:
        """Write ``key``; the new revision."""
        ...

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        """Apply ``ops`` if every compare holds (``CasConflict`` else).

        Returns the revision and how many keys the first op deleted.
        """
        ...

    async def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """Every read of the batch in one request, at one revision."""
        ...

    async def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``ops`` if every compare holds; else ``reads`` from the same request."""
        ...

    async def watch(
        self, prefix: str, start_revision: int
    ) -> tuple[EventQueue, Callable[[], None]]:
        """Start a watch once the server has created it: its queue, and how to cancel it."""
        ...

    async def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` whole seconds."""
        ...

    async def keep_alive(self, lease: int) -> None:
        """Refresh ``lease``; ``LeaseLost`` if it is gone."""
        ...

    async def revoke(self, lease: int) -> None:
        """End ``lease``; no error if it is already gone."""
        ...


class EtcdStore:
    """:class:`~allocator.store.base.Store` on etcd v3 over gRPC.

    Every call has one budget, ``timeout`` seconds (the URL's ``timeout=``),
    that covers connecting, logging in, failing over and the request: each
    inner deadline is what is left of it. A write sent but not confirmed
    within it raises :class:`~allocator.errors.AmbiguousWrite`.
    """

    max_txn_ops: int | None = MAX_TXN_OPS

    def __init__(
        self,
        config: EtcdConfig,
        url: str,
        connect: Callable[[int], EtcdConnection],
        status_of: StatusOf,
        translate: Callable[[BaseException, str], AllocatorError],
    ) -> None:
        from allocator.store.credentials import remember_secret

        remember_secret(config.password)
        self.url = redact_url(url)
        self.config = config
        self.endpoints = config.endpoint_names
        self._calls = EndpointCalls(config, connect, status_of, translate)
        self._closed = False
        self._state_lock = threading.Lock()
        self._watches: set[EtcdWatch] = set()
        self._loop = _LOOP.acquire()

    # --- reads and writes ----------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None``."""
        check_key(key)
        return self._call(lambda conn: conn.get(key), idempotent=True)

    def list(self, prefix: str) -> Listing:
        """Every key under ``prefix``, sorted, with the revision read at: one range request."""
        check_prefix(prefix)
        return self._call(lambda conn: conn.list(prefix), idempotent=True)

    def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_revision: int | None = None,
        lease: int | None = None,
    ) -> int:
        """Write ``key``; with ``expect_revision``, only if that still holds."""
        if expect_revision is not None:
            return self.txn([Compare(key, expect_revision)], [Put(key, value, lease)])
        check_value(check_key(key), value)
        leased = lease_of(lease)
        return self._call(lambda conn: conn.put(key, value, leased))

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        ops = [Delete(key)]
        check_txn(compares, ops, self.max_txn_ops)
        return self._call(lambda conn: conn.txn(compares, ops))[1] > 0

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` at one revision if every compare holds, else ``CasConflict``."""
        check_txn(compares, ops, self.max_txn_ops)
        return self._call(lambda conn: conn.txn(compares, ops))[0]

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One listing per item of ``reads``: one request, all at one revision."""
        check_reads(reads)
        return self._call(lambda conn: conn.read_many(reads), idempotent=True)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``txn``; a failed compare returns ``reads`` from the same request's failure branch."""
        check_txn(compares, ops, self.max_txn_ops)
        check_reads(reads)
        return self._call(lambda conn: conn.txn_or_read(compares, ops, reads))

    # --- watches -------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> EtcdWatch:
        """Watch ``prefix`` for changes at ``start_revision`` and later.

        Raises ``StoreUnavailable``/``PermissionDenied`` if the watch cannot
        be created; a compacted start revision is raised by ``next()``.
        """
        check_prefix(prefix)
        queue, cancel = self._call(lambda conn: conn.watch(prefix, start_revision), idempotent=True)
        watch = EtcdWatch(queue, lambda: self._loop.call_soon(cancel), self._forget)
        with self._state_lock:
            self._watches.add(watch)
        return watch

    def _forget(self, watch: EtcdWatch) -> None:
        with self._state_lock:
            self._watches.discard(watch)

    # --- leases --------------------------------------------------------------

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds (rounded up: etcd counts whole seconds)."""
        seconds = max(1, math.ceil(check_ttl(ttl)))
        return self._call(lambda conn: conn.grant(seconds))

    def refresh_lease(self, lease: int) -> None:
        """Send one keep-alive; ``LeaseLost`` if the lease expired or was revoked."""
        self._call(lambda conn: conn.keep_alive(lease), idempotent=True)

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys; no error if it is already gone."""
        self._call(lambda conn: conn.revoke(lease), idempotent=True)

    # --- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every watch, the channel and the loop thread. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            watches, self._watches = list(self._watches), set()
        for watch in watches:
            watch.queue.close()
        with contextlib.suppress(AllocatorError):
            self._loop.run(self._calls.close(), self.config.timeout, self.endpoints)
        _LOOP.release(self._loop, self.config.timeout)

    def __enter__(self) -> EtcdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, op: Callable[[EtcdConnection], Awaitable[_T]], *, idempotent: bool = False
    ) -> _T:
        """Run ``op`` on the loop (see :class:`~allocator.store.etcd.grpc_calls.EndpointCalls`).

        The loop thread gives up a little after the call's budget: a write
        it gave up on may have been applied (``AmbiguousWrite``).
        """
        guard = self.config.timeout + _GUARD_SLACK_S
        with self._state_lock:
            if self._closed:
                raise StoreError(f"the etcd store for {self.endpoints} is closed")
            coro = self._calls.run(op, idempotent)
        unconfirmed = None if idempotent else ambiguous_write(self.endpoints, self.config.timeout)
        return self._loop.run(coro, guard, f"etcd at {self.endpoints}", timeout_error=unconfirmed)


if TYPE_CHECKING:  # mypy checks the class against the protocol
    _STORE: type[Store] = EtcdStore
