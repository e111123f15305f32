"""The etcd v3 backend (``etcd://h1:2379,h2:2379``, ``etcds://`` for TLS).

The only module that imports ``aetcd`` (and grpc, which it is built on). It
uses aetcd's generated gRPC stubs rather than its ``Client``, which has no
TLS, drops a transaction's revision and keeps a watch the server refused as
if live. Each store runs a private loop thread (aetcd is asyncio-only) and
one gRPC channel shared by every call and watch; with several endpoints it
talks to one at a time and moves on when that one cannot take a call.

Semantics: store revision = etcd revision; compare-and-swap = a transaction
comparing ``mod_revision`` (``create_revision == 0``: "must not exist") whose
failure branch reads the compared keys, so ``CasConflict`` names exactly the
keys that changed; a list is one range request; a watch is one gRPC stream
from a start revision, and every way it can end reaches ``next()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

# gRPC core otherwise prints INFO lines (a failed TLS handshake, say) to
# stderr, under the CLI's one-line error. Read when grpc loads; an operator's
# own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
from aetcd import rpc

from allocator.errors import (
    AllocatorError,
    CasConflict,
    Compacted,
    LeaseLost,
    StoreError,
    StoreUnavailable,
)
from allocator.store._local import (
    check_key,
    check_prefix,
    check_ttl,
    check_txn,
    check_value,
    lease_of,
)
from allocator.store.aio_bridge import EventQueue, LoopThread
from allocator.store.base import Compare, Delete, Event, KeyValue, Listing, Op, Put, Store, Watch
from allocator.store.etcd_config import (
    EtcdConfig,
    format_endpoint,
    parse_etcd_url,
    read_pem,
)
from allocator.store.etcd_rules import (
    MAX_TXN_OPS,
    ambiguous_write,
    attempt_timeout,
    conflict,
    maybe_applied,
    prefix_range_end,
    token_is_stale,
    translate_status,
    watch_error,
    worth_another_endpoint,
)
from allocator.store.urls import redact_url

__all__ = ["MAX_TXN_OPS", "EtcdStore", "EtcdWatch", "open_etcd", "translate_error"]

#: Seconds past a call's budget before the loop thread gives up on it: a
#: hang guard only, since every request carries a deadline inside the budget.
_GUARD_SLACK_S = 1.0
# When the current call must be done by (loop time); each call is its own task.
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("etcd_call_deadline")

_T = TypeVar("_T")
_Op = Callable[["_Connection"], Awaitable[_T]]


def open_etcd(url: str, *, create: bool = False) -> EtcdStore:
    """Open an etcd store for ``url`` (syntax in :mod:`allocator.store.etcd_config`).

    No network I/O happens here; the first call connects. A malformed URL,
    an unreadable TLS file or half-given credentials raise ``StoreConfigError``.
    ``create`` is accepted for the common factory signature (an etcd
    cluster always exists).
    """
    return EtcdStore(parse_etcd_url(url), url)


def _remaining() -> float:
    """Seconds left before the current call's deadline (at least a millisecond)."""
    return max(_DEADLINE.get() - asyncio.get_running_loop().time(), 0.001)


def _status(exc: BaseException) -> tuple[int, str] | None:
    """The gRPC status code and details of a gRPC error (``None``: not one)."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return None
    return int(exc.code().value[0]), exc.details() or ""


def _maybe_applied(exc: BaseException) -> bool:
    """Whether a write that failed with ``exc`` after being sent may still have committed."""
    if isinstance(exc, TimeoutError | asyncio.CancelledError):
        return True
    status = _status(exc)
    return status is not None and maybe_applied(*status)


def _worth_another_endpoint(exc: BaseException, idempotent: bool) -> bool:
    status = _status(exc)
    return status is not None and worth_another_endpoint(*status, idempotent)


def _token_is_stale(exc: BaseException) -> bool:
    # A refused watch reports a stale token as its cancel reason, hence str(exc).
    status = _status(exc)
    return token_is_stale(status[1] if status is not None and status[1] else str(exc))


def translate_error(exc: BaseException, where: str) -> AllocatorError:
    """Map a grpc/aetcd exception onto allocator's tree; ``where`` names the endpoint(s)."""
    if isinstance(exc, AllocatorError):
        return exc
    if isinstance(exc, TimeoutError):
        return StoreUnavailable(f"etcd at {where} did not answer in time")
    status = _status(exc)
    if status is None:
        return StoreError(f"etcd at {where}: {exc!r}")
    return translate_status(*status, where)


# --- one channel to one endpoint ---------------------------------------------------

_CHANNEL_OPTIONS = (
    # After a long outage the channel must not go on backing off for minutes
    # once etcd is back (gRPC's default cap is 120 s).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # gRPC uses this as the connect timeout: a silent endpoint fails in 3 s.
    ("grpc.min_reconnect_backoff_ms", 3000),
    # Pings find a silently dead peer under a watch; etcd accepts one per 5 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # 1,000 hosts x 8 GPUs come back in one range read.
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
)


class _Connection:
    """One gRPC channel to one endpoint, its stubs and its auth token."""

    def __init__(self, config: EtcdConfig, index: int, credentials: Any) -> None:
        self.config = config
        self.endpoint = format_endpoint(*config.endpoints[index])
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(self.endpoint, options=_CHANNEL_OPTIONS)
        else:
            self.channel = grpc.aio.secure_channel(
                self.endpoint, credentials, options=_CHANNEL_OPTIONS
            )
        self.kv = rpc.KVStub(self.channel)
        self.lease = rpc.LeaseStub(self.channel)
        self.watch = rpc.WatchStub(self.channel)
        self.metadata: Any = None

    async def authenticate(self) -> None:
        """Get a fresh token when the config names a user; no-op otherwise."""
        if self.config.username is None:
            return
        request = rpc.AuthenticateRequest(name=self.config.username, password=self.config.password)
        reply = await rpc.AuthStub(self.channel).Authenticate(request, timeout=_remaining())
        self.metadata = (("token", reply.token),)

    def ready(self) -> bool:
        """Whether the channel has a live connection (requests can have gone out on it)."""
        state = self.channel.get_state(try_to_connect=False)
        return bool(state == grpc.ChannelConnectivity.READY)

    @property
    def call_options(self) -> dict[str, Any]:
        """Keyword arguments for a call: what is left of its deadline, and the token."""
        return {"timeout": _remaining(), "metadata": self.metadata}


def _tls_credentials(config: EtcdConfig) -> Any:
    if not config.tls:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(config.cacert, "CA certificate"),
        private_key=read_pem(config.key, "client key"),
        certificate_chain=read_pem(config.cert, "client certificate"),
    )


# --- requests and replies ------------------------------------------------------------


def _key(key: str) -> bytes:
    return key.encode("utf-8")


def _prefix_range(prefix: str) -> tuple[bytes, bytes]:
    start = _key(prefix)
    return start, prefix_range_end(start)


def _key_value(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key.decode(),
        value=bytes(kv.value),
        mod_revision=kv.mod_revision,
        create_revision=kv.create_revision,
        lease=kv.lease or None,
    )


def _event(item: Any) -> Event:
    kv = item.kv
    if item.type == rpc.Event.PUT:
        return Event("put", kv.key.decode(), bytes(kv.value), kv.mod_revision)
    return Event("delete", kv.key.decode(), None, kv.mod_revision)


def _request_op(op: Op) -> Any:
    if isinstance(op, Put):
        put = rpc.PutRequest(key=_key(op.key), value=op.value, lease=op.lease or 0)
        return rpc.RequestOp(request_put=put)
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=_key(op.key)))


def _compare(compare: Compare) -> Any:
    key = _key(compare.key)
    if compare.mod_revision == 0:  # must not exist
        return rpc.Compare(
            key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0
        )
    return rpc.Compare(
        key=key,
        target=rpc.Compare.MOD,
        result=rpc.Compare.EQUAL,
        mod_revision=compare.mod_revision,
    )


def _txn_request(compares: Sequence[Compare], ops: Sequence[Any]) -> Any:
    # The failure branch reads every compared key, so a conflict can name the
    # keys that changed as of the very revision the compare failed at.
    reads = [
        rpc.RequestOp(request_range=rpc.RangeRequest(key=_key(c.key), keys_only=True))
        for c in compares
    ]
    return rpc.TxnRequest(compare=[_compare(c) for c in compares], success=ops, failure=reads)


def _conflict(compares: Sequence[Compare], reply: Any) -> CasConflict:
    found = []
    for response in reply.responses:
        kvs = response.response_range.kvs
        found.append(kvs[0].mod_revision if kvs else 0)
    return conflict(compares, found)


# --- watches -----------------------------------------------------------------------


def _watch_error(response: Any, where: str) -> AllocatorError | None:
    return watch_error(
        int(response.compact_revision), response.canceled, response.cancel_reason, where
    )


async def _pump_watch(
    conn: _Connection, create: Any, queue: EventQueue, created: asyncio.Future[None]
) -> None:
    """Feed one watch stream into ``queue`` until it ends; every ending is an error.

    ``created`` resolves once the server has the watch, or carries the error
    that refused it (a compacted start revision is left for ``next()``).
    """
    call = conn.watch.Watch(metadata=conn.metadata)
    try:
        await call.write(rpc.WatchRequest(create_request=create))
        async for response in call:
            error = _watch_error(response, conn.endpoint)
            if error is not None:
                _settle(created, None if isinstance(error, Compacted) else error)
                queue.fail(error)
                return
            if response.created:
                _settle(created, None)
            if response.events:
                queue.put([_event(item) for item in response.events])
    except Exception as exc:
        _settle(created, exc)  # raw, so watch() can fail over or log in again
        queue.fail(translate_error(exc, conn.endpoint))
    finally:
        _settle(created, None)
        call.cancel()
        # However the stream ended (cleanly, or its channel was closed under
        # it), next() must say so; the first error recorded wins.
        queue.fail(StoreUnavailable(f"etcd at {conn.endpoint}: the watch stream ended"))


def _settle(created: asyncio.Future[None], error: BaseException | None) -> None:
    if created.done():
        return
    if error is None:
        created.set_result(None)
    else:
        created.set_exception(error)


class EtcdWatch:
    """A prefix watch; see :class:`~allocator.store.base.Watch`."""

    def __init__(self, store: EtcdStore, queue: EventQueue, task: asyncio.Task[None]) -> None:
        self._store = store
        self._queue = queue
        self._task = task

    def next(self, timeout: float) -> list[Event]:
        """Return the next batch of events, or ``[]`` after ``timeout`` seconds."""
        return self._queue.next(timeout)

    def close(self) -> None:
        """Stop watching (the stream is cancelled). Idempotent."""
        if self._queue.close():
            self._store._forget(self)
            self._store._loop.call_soon(self._task.cancel)


# --- the store ---------------------------------------------------------------------


class EtcdStore:
    """:class:`~allocator.store.base.Store` on etcd v3.

    Every call has one budget, ``timeout`` seconds (the URL's ``timeout=``),
    that covers connecting, logging in, failing over and the request: each
    inner deadline is what is left of it. A write sent but not confirmed
    within it raises :class:`~allocator.errors.AmbiguousWrite`.
    """

    max_txn_ops: int | None = MAX_TXN_OPS

    def __init__(self, config: EtcdConfig, url: str) -> None:
        from allocator.secrets import remember_secret

        remember_secret(config.password)
        self.url = redact_url(url)
        self.config = config
        self.endpoints = config.endpoint_names
        self._credentials = _tls_credentials(config)  # bad TLS files fail before any thread
        self._index = 0
        self._conn: _Connection | None = None
        self._conn_lock = asyncio.Lock()
        self._closed = False
        self._state_lock = threading.Lock()
        self._watches: set[EtcdWatch] = set()
        self._loop = LoopThread(name=f"allocator-etcd {self.endpoints}")

    # --- reads and writes ----------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None``."""
        request = rpc.RangeRequest(key=_key(check_key(key)))

        async def op(conn: _Connection) -> KeyValue | None:
            reply = await conn.kv.Range(request, **conn.call_options)
            return _key_value(reply.kvs[0]) if reply.kvs else None

        return self._call(op, idempotent=True)

    def list(self, prefix: str) -> Listing:
        """Every key under ``prefix``, sorted, with the revision read at: one range request."""
        start, end = _prefix_range(check_prefix(prefix))
        request = rpc.RangeRequest(
            key=start,
            range_end=end,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.KEY,
        )

        async def op(conn: _Connection) -> Listing:
            reply = await conn.kv.Range(request, **conn.call_options)
            items = tuple(_key_value(kv) for kv in reply.kvs)
            return Listing(items=items, revision=int(reply.header.revision))

        return self._call(op, idempotent=True)

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
        request = rpc.PutRequest(key=_key(key), value=value, lease=lease_of(lease) or 0)

        async def op(conn: _Connection) -> int:
            reply = await conn.kv.Put(request, **conn.call_options)
            return int(reply.header.revision)

        return self._call(op)

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        check_txn(compares, [Delete(key)], self.max_txn_ops)
        request = _txn_request(compares, [_request_op(Delete(key))])

        async def op(conn: _Connection) -> bool:
            reply = await self._txn(conn, compares, request)
            return bool(reply.responses[0].response_delete_range.deleted)

        return self._call(op)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` at one revision if every compare holds, else ``CasConflict``."""
        check_txn(compares, ops, self.max_txn_ops)
        request = _txn_request(compares, [_request_op(op) for op in ops])

        async def op(conn: _Connection) -> int:
            reply = await self._txn(conn, compares, request)
            return int(reply.header.revision)

        return self._call(op)

    async def _txn(self, conn: _Connection, compares: Sequence[Compare], request: Any) -> Any:
        reply = await conn.kv.Txn(request, **conn.call_options)
        if not reply.succeeded:
            raise _conflict(compares, reply)
        return reply

    # --- watches -------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> EtcdWatch:
        """Watch ``prefix`` for changes at ``start_revision`` and later.

        Raises ``StoreUnavailable``/``PermissionDenied`` if the watch cannot
        be created; a compacted start revision is raised by ``next()``.
        """
        start, end = _prefix_range(check_prefix(prefix))
        create = rpc.WatchCreateRequest(
            key=start, range_end=end, start_revision=max(start_revision, 0)
        )

        async def op(conn: _Connection) -> tuple[EventQueue, asyncio.Task[None]]:
            # A fresh queue per attempt: a refused attempt has failed its own.
            queue = EventQueue()
            created: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(_pump_watch(conn, create, queue, created))
            try:
                await asyncio.wait_for(created, _remaining())
            except BaseException:
                task.cancel()
                raise
            return queue, task

        watch = EtcdWatch(self, *self._call(op, idempotent=True))
        with self._state_lock:
            self._watches.add(watch)
        return watch

    def _forget(self, watch: EtcdWatch) -> None:
        with self._state_lock:
            self._watches.discard(watch)

    # --- leases --------------------------------------------------------------

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds (rounded up: etcd counts whole seconds)."""
        request = rpc.LeaseGrantRequest(TTL=max(1, math.ceil(check_ttl(ttl))))

        async def op(conn: _Connection) -> int:
            reply = await conn.lease.LeaseGrant(request, **conn.call_options)
            if reply.error:
                raise StoreError(f"etcd at {conn.endpoint}: lease grant failed: {reply.error}")
            return int(reply.ID)

        return self._call(op)

    def refresh_lease(self, lease: int) -> None:
        """Send one keep-alive; ``LeaseLost`` if the lease expired or was revoked."""

        async def op(conn: _Connection) -> None:
            call = conn.lease.LeaseKeepAlive(**conn.call_options)
            await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
            await call.done_writing()
            reply = await call.read()
            # Read to the end, so the stream finishes rather than being abandoned.
            while await call.read() is not grpc.aio.EOF:
                pass
            if reply is grpc.aio.EOF or reply.TTL <= 0:
                raise LeaseLost(f"etcd at {conn.endpoint}: lease {lease:x} has expired")

        self._call(op, idempotent=True)

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys; no error if it is already gone."""

        async def op(conn: _Connection) -> None:
            try:
                await conn.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), **conn.call_options)
            except grpc.aio.AioRpcError as exc:
                if "lease not found" not in (exc.details() or ""):
                    raise

        self._call(op, idempotent=True)

    # --- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every watch, the channel and the loop thread. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            watches, self._watches = list(self._watches), set()
        for watch in watches:
            watch._queue.close()
        with contextlib.suppress(AllocatorError):
            self._loop.run(self._close_channel(), self.config.timeout, self.endpoints)
        self._loop.stop(self.config.timeout)

    async def _close_channel(self) -> None:
        async with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.channel.close()

    def __enter__(self) -> EtcdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ------------------------------------------------------------

    def _call(self, op: _Op[_T], *, idempotent: bool = False) -> _T:
        """Run ``op`` on the loop against the current connection, errors translated.

        The whole call, failovers included, fits in ``config.timeout``. With
        several endpoints, a call the current one could not take is tried on
        the next: any ``idempotent`` call, and any other call only when it
        cannot have been applied (no connection, no leader). A write that was
        sent but not answered raises ``AmbiguousWrite``.
        """
        guard = self.config.timeout + _GUARD_SLACK_S
        with self._state_lock:
            if self._closed:
                raise StoreError(f"the etcd store for {self.endpoints} is closed")
            coro = self._attempt(op, idempotent)
        unconfirmed = None if idempotent else ambiguous_write(self.endpoints, self.config.timeout)
        return self._loop.run(coro, guard, f"etcd at {self.endpoints}", timeout_error=unconfirmed)

    async def _attempt(self, op: _Op[_T], idempotent: bool) -> _T:
        loop = asyncio.get_running_loop()
        overall = loop.time() + self.config.timeout
        count = len(self.config.endpoints)
        for tried in range(1, count + 1):
            share = attempt_timeout(overall - loop.time(), count - tried + 1)
            _DEADLINE.set(loop.time() + share)
            conn: _Connection | None = None
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
                if sent and not idempotent and _maybe_applied(exc):
                    raise ambiguous_write(where, self.config.timeout) from exc
                if tried == count or not _worth_another_endpoint(exc, idempotent or not sent):
                    raise translate_error(exc, where) from exc
                await self._next_endpoint(conn)
        raise AssertionError("every attempt returns or raises")

    @staticmethod
    async def _with_fresh_token(conn: _Connection, op: _Op[_T]) -> _T:
        try:
            return await op(conn)
        except Exception as exc:
            # Log in again, once, as etcd's own client does.
            if not _token_is_stale(exc) or conn.config.username is None:
                raise
        await conn.authenticate()
        return await op(conn)

    async def _connection(self) -> _Connection:
        async with self._conn_lock:
            if self._conn is None:
                conn = _Connection(self.config, self._index, self._credentials)
                try:
                    await conn.authenticate()
                except BaseException:
                    await conn.channel.close()
                    raise
                self._conn = conn
            return self._conn

    async def _next_endpoint(self, failed: _Connection | None) -> None:
        async with self._conn_lock:
            if failed is not None and self._conn is failed:
                self._conn = None
                await failed.channel.close()
            self._index = (self._index + 1) % len(self.config.endpoints)


if TYPE_CHECKING:  # mypy checks both classes against the protocols
    _STORE: type[Store] = EtcdStore
    _WATCH: type[Watch] = EtcdWatch
