"""The etcd v3 backend over gRPC (``etcd://h1:2379,h2:2379``, ``etcds://`` for TLS).

The only module that imports ``aetcd`` (and grpc, which it is built on),
and the one that translates their errors. It uses aetcd's generated gRPC
stubs rather than its ``Client``, which has no TLS, drops a transaction's
revision and keeps a watch the server refused as if live. Each store has one
gRPC channel shared by every call and watch, driven by the process's one
loop thread (aetcd is asyncio-only); with several endpoints it talks to one at a time and
moves on when that one cannot take a call (:mod:`allocator.store.etcd.grpc_calls`).
Long-lived callers (the agent) use this backend: gRPC keep-alive pings find
a silently dead peer under a watch. One-shot commands use the JSON gateway
(:mod:`allocator.store.etcd.store`), which starts without loading gRPC.

Semantics: store revision = etcd revision; compare-and-swap = a transaction
comparing ``mod_revision`` (``create_revision == 0``: "must not exist") whose
failure branch reads the compared keys, so ``CasConflict`` names exactly the
keys that changed; a list is one range request; a watch is one gRPC stream
from a start revision, and every way it can end reaches ``next()``
(:mod:`allocator.store.etcd.grpc_watch`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

# gRPC core otherwise prints INFO lines (a failed TLS handshake, say) to
# stderr, under the CLI's one-line error. Read when grpc loads; an operator's
# own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
from aetcd import rpc

from allocator.errors import (
    AllocatorError,
    CasConflict,
    LeaseLost,
    StoreError,
    StoreUnavailable,
)
from allocator.store.base import Compare, Event, KeyValue, Listing, Op, Put, Read, TxnOutcome
from allocator.store.etcd.config import EtcdConfig, format_endpoint, parse_etcd_url, read_pem
from allocator.store.etcd.grpc_bridge import EventQueue
from allocator.store.etcd.grpc_calls import remaining
from allocator.store.etcd.grpc_store import EtcdStore
from allocator.store.etcd.grpc_watch import EtcdWatch, WatchReply, pump_watch
from allocator.store.etcd.rules import (
    MAX_TXN_OPS,
    conflict,
    prefix_range_end,
    translate_status,
    watch_error,
)

__all__ = ["MAX_TXN_OPS", "EtcdStore", "EtcdWatch", "open_etcd", "translate_error"]

_Cancel = Callable[[], None]


def open_etcd(url: str, *, create: bool = False) -> EtcdStore:
    """Open an etcd store for ``url`` (syntax in :mod:`allocator.store.etcd.config`).

    No network I/O happens here; the first call connects. A malformed URL,
    an unreadable TLS file or half-given credentials raise ``StoreConfigError``.
    ``create`` is accepted for the common factory signature (an etcd
    cluster always exists).
    """
    config = parse_etcd_url(url)
    credentials = _tls_credentials(config)  # bad TLS files fail before any thread

    def connect(index: int) -> _Connection:
        return _Connection(config, index, credentials)

    return EtcdStore(config, url, connect, _status, translate_error)


def _status(exc: BaseException) -> tuple[int, str] | None:
    """The gRPC status code and details of a gRPC error (``None``: not one)."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return None
    return int(exc.code().value[0]), exc.details() or ""


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
        self.watch_stub = rpc.WatchStub(self.channel)
        self.metadata: Any = None

    async def authenticate(self) -> None:
        """Get a fresh token when the config names a user; no-op otherwise."""
        if self.config.username is None:
            return
        request = rpc.AuthenticateRequest(name=self.config.username, password=self.config.password)
        reply = await rpc.AuthStub(self.channel).Authenticate(request, timeout=remaining())
        self.metadata = (("token", reply.token),)

    def ready(self) -> bool:
        """Whether the channel has a live connection (requests can have gone out on it)."""
        state = self.channel.get_state(try_to_connect=False)
        return bool(state == grpc.ChannelConnectivity.READY)

    async def close(self) -> None:
        """Close the channel (its calls and watches end)."""
        await self.channel.close()

    @property
    def call_options(self) -> dict[str, Any]:
        """Keyword arguments for a call: what is left of its deadline, and the token."""
        return {"timeout": remaining(), "metadata": self.metadata}

    # --- what the store asks of a connection (see etcd_store.EtcdConnection) ----------

    async def get(self, key: str) -> KeyValue | None:
        """The current version of ``key``."""
        reply = await self.kv.Range(rpc.RangeRequest(key=_key(key)), **self.call_options)
        return _key_value(reply.kvs[0]) if reply.kvs else None

    async def list(self, prefix: str) -> Listing:
        """Every key under ``prefix``, sorted, in one range read."""
        start, end = _prefix_range(prefix)
        request = rpc.RangeRequest(
            key=start,
            range_end=end,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.KEY,
        )
        reply = await self.kv.Range(request, **self.call_options)
        items = tuple(_key_value(kv) for kv in reply.kvs)
        return Listing(items=items, revision=int(reply.header.revision))

    async def put(self, key: str, value: bytes, lease: int | None) -> int:
        """Write ``key``; the new revision."""
        request = rpc.PutRequest(key=_key(key), value=value, lease=lease or 0)
        reply = await self.kv.Put(request, **self.call_options)
        return int(reply.header.revision)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        """Apply ``ops`` if every compare holds; the revision and what the first op deleted."""
        request = _txn_request(compares, [_request_op(op) for op in ops])
        reply = await self.kv.Txn(request, **self.call_options)
        if not reply.succeeded:
            raise _conflict(compares, reply)
        first = reply.responses[0] if reply.responses else None
        deleted = first.response_delete_range.deleted if first is not None else 0
        return int(reply.header.revision), int(deleted)

    async def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """Every read of the batch in one transaction (no compares): one revision."""
        request = rpc.TxnRequest(success=[_range_op(r) for r in reads])
        reply = await self.kv.Txn(request, **self.call_options)
        return _listings(reply.responses, int(reply.header.revision))

    async def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``ops`` if every compare holds; else the compared keys and ``reads``, same request."""
        request = _txn_request(compares, [_request_op(op) for op in ops], reads)
        reply = await self.kv.Txn(request, **self.call_options)
        revision = int(reply.header.revision)
        if reply.succeeded:
            return TxnOutcome(True, revision)
        changed = _conflict(compares, reply).keys
        return TxnOutcome(
            False, revision, changed, _listings(reply.responses[len(compares) :], revision)
        )

    async def watch(
        self, prefix: str, start_revision: int
    ) -> tuple[EventQueue, Callable[[], None]]:
        """Start a watch and wait until etcd has created it (or refused it)."""
        start, end = _prefix_range(prefix)
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=start, range_end=end, start_revision=max(start_revision, 0)
            )
        )
        queue = EventQueue()  # a fresh queue per attempt: a refused one has failed its own
        created: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        where = self.endpoint
        task = asyncio.create_task(
            pump_watch(
                self.watch_stub.Watch(metadata=self.metadata),
                create,
                lambda response: _watch_reply(response, where),
                lambda exc: translate_error(exc, where),
                where,
                queue,
                created,
            )
        )
        try:
            await asyncio.wait_for(created, remaining())
        except BaseException:
            task.cancel()
            raise

        def cancel() -> None:
            task.cancel()

        return queue, cancel

    async def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` whole seconds."""
        reply = await self.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl), **self.call_options)
        if reply.error:
            raise StoreError(f"etcd at {self.endpoint}: lease grant failed: {reply.error}")
        return int(reply.ID)

    async def keep_alive(self, lease: int) -> None:
        """Send one keep-alive; ``LeaseLost`` if the lease expired or was revoked."""
        call = self.lease.LeaseKeepAlive(**self.call_options)
        await call.write(rpc.LeaseKeepAliveRequest(ID=lease))
        await call.done_writing()
        reply = await call.read()
        # Read to the end, so the stream finishes rather than being abandoned.
        while await call.read() is not grpc.aio.EOF:
            pass
        if reply is grpc.aio.EOF or reply.TTL <= 0:
            raise LeaseLost(f"etcd at {self.endpoint}: lease {lease:x} has expired")

    async def revoke(self, lease: int) -> None:
        """End ``lease``; no error if it is already gone."""
        try:
            await self.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), **self.call_options)
        except grpc.aio.AioRpcError as exc:
            if "lease not found" not in (exc.details() or ""):
                raise


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


def _txn_request(
    compares: Sequence[Compare], ops: Sequence[Any], extra: Sequence[Read] = ()
) -> Any:
    # The failure branch reads every compared key, so a conflict can name the
    # keys that changed as of the very revision the compare failed at; the
    # caller's own reads follow, so a lost compare brings back fresh state.
    reads = [
        rpc.RequestOp(request_range=rpc.RangeRequest(key=_key(c.key), keys_only=True))
        for c in compares
    ] + [_range_op(r) for r in extra]
    return rpc.TxnRequest(compare=[_compare(c) for c in compares], success=ops, failure=reads)


def _range_op(read: Read) -> Any:
    if not read.prefix:
        request = rpc.RangeRequest(key=_key(read.key), keys_only=not read.values)
    else:
        start, end = _prefix_range(read.key)
        request = rpc.RangeRequest(
            key=start,
            range_end=end,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.KEY,
            keys_only=not read.values,
        )
    return rpc.RequestOp(request_range=request)


def _listings(responses: Any, revision: int) -> tuple[Listing, ...]:
    return tuple(
        Listing(tuple(_key_value(kv) for kv in r.response_range.kvs), revision) for r in responses
    )


def _conflict(compares: Sequence[Compare], reply: Any) -> CasConflict:
    found = []
    for response in reply.responses[: len(compares)]:
        kvs = response.response_range.kvs
        found.append(kvs[0].mod_revision if kvs else 0)
    return conflict(compares, found)


def _watch_reply(response: Any, where: str) -> WatchReply:
    error = watch_error(
        int(response.compact_revision), response.canceled, response.cancel_reason, where
    )
    return [_event(item) for item in response.events], error, bool(response.created)


if TYPE_CHECKING:  # mypy checks the connection against what the store asks of it
    from allocator.store.etcd.grpc_store import EtcdConnection

    _CONNECTION: type[EtcdConnection] = _Connection
