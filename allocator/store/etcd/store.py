"""The etcd v3 backend (``etcd://``, ``etcds://``), over etcd's JSON gateway.

etcd serves its v3 API as JSON on the client port (``/v3/kv/range``,
``/v3/kv/txn``, ``/v3/lease/*``, ``/v3/watch`` as a stream,
``/v3/auth/authenticate``; on by default since 3.4). This client needs only
the standard library and ``h11`` (``ssl`` only for a TLS endpoint), so a
command on etcd starts about as fast as on SQLite, and every caller (CLI
commands, the agent, ``serve``, library users) uses the same code.

What it guarantees:

* every call has one budget, ``timeout`` seconds, covering connecting,
  TLS, logging in, failing over and the request; with several endpoints
  each gets an equal share of what is left (:func:`attempt_timeout`);
* a call the current endpoint could not take moves on to the next one:
  any read, and a write only when it cannot have been applied (no
  connection, no leader); a write sent but not confirmed raises
  :class:`~allocator.errors.AmbiguousWrite` ("may have been applied");
* every answer must be etcd's (its ``header.cluster_id``, or etcd's JSON
  error): anything else (an HTML page, a proxy's 502, an SSH banner, a
  ``{}``) is another server, which a read moves past; a write goes only
  to an endpoint etcd has answered on (one status call first otherwise),
  so it too moves past one that is not etcd;
* TLS with a CA, client certificate and key (``etcds://``); user and
  password, logging in again once when etcd says the token is stale;
* etcd's answers are translated by :mod:`allocator.store.etcd.rules`;
* a watch ends with ``StoreUnavailable`` when its connection breaks or
  etcd vanishes (TCP keep-alive probes); an etcd that hangs (stopped, its
  connections open) leaves a watch merely quiet, so whoever holds one also
  makes calls, whose deadline finds the hang: the agent's lease keep-alive,
  ``serve``'s check of a quiet watch (:mod:`allocator.serve.watcher`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from allocator.errors import Compacted, LeaseLost, PermissionDenied, StoreError
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
    Watch,
)
from allocator.store.etcd.calls import EndpointCalls
from allocator.store.etcd.config import EtcdConfig, parse_etcd_url
from allocator.store.etcd.connection import Endpoint, tls_context
from allocator.store.etcd.json_api import (
    Json,
    b64,
    conflict_of,
    key_value_of,
    listings_of,
    range_listing,
    range_request,
    read_ops,
    txn_request,
    watch_request,
)
from allocator.store.etcd.rules import MAX_TXN_OPS, Code, EtcdStatus, prefix_range_end
from allocator.store.local import (
    check_key,
    check_limit,
    check_prefix,
    check_reads,
    check_ttl,
    check_txn,
    check_value,
)
from allocator.store.local import lease_of as _lease_of
from allocator.store.urls import redact_url

if TYPE_CHECKING:
    from allocator.store.etcd.watch import EtcdWatch

__all__ = ["MAX_TXN_OPS", "EtcdStore", "open_etcd"]


def open_etcd(url: str, *, create: bool = False) -> EtcdStore:
    """Open an etcd store for ``url`` that talks to etcd's JSON gateway.

    No network I/O happens here; the first call connects. A malformed URL,
    an unreadable TLS file or half-given credentials raise
    ``StoreConfigError``. ``create`` is accepted for the common factory
    signature (an etcd cluster always exists).
    """
    return EtcdStore(parse_etcd_url(url), url)


class EtcdStore:
    """:class:`~allocator.store.base.Store` on etcd v3's JSON gateway (see the module doc)."""

    max_txn_ops: int | None = MAX_TXN_OPS

    def __init__(self, config: EtcdConfig, url: str) -> None:
        from allocator.store.credentials import remember_secret

        remember_secret(config.password)
        self.url = redact_url(url)
        self.config = config
        self.endpoints = config.endpoint_names
        # Bad TLS files fail here, before any connection.
        self._calls = EndpointCalls(config, tls_context(config))
        self._lock = self._calls.lock
        self._watches: set[EtcdWatch] = set()

    # --- reads and writes ----------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None``."""
        with self._naming("range", key):
            reply = self._calls.call("/v3/kv/range", range_request(check_key(key)), idempotent=True)
        kvs = reply.get("kvs") or []
        return key_value_of(kvs[0]) if kvs else None

    def list(self, prefix: str, *, limit: int | None = None, descending: bool = False) -> Listing:
        """Every key under ``prefix``, sorted, with the revision read at: one range request.

        ``limit`` and ``descending`` go into the range itself (etcd's
        ``limit`` and ``sort_order``): etcd reads and sends only those keys.
        """
        check_limit(limit)
        request = range_request(
            check_prefix(prefix), prefix=True, limit=limit, descending=descending
        )

        def send(endpoint: Endpoint, until: float) -> Listing:
            return endpoint.post_as("/v3/kv/range", request, until, range_listing)

        with self._naming("range", prefix, prefix=True):
            return self._calls.run(send, idempotent=True)

    def list_parts(
        self, prefix: str, revision: int, splits: Sequence[str] = ()
    ) -> Iterator[Listing]:
        """Every key under ``prefix`` as at ``revision``: ``len(splits) + 1`` ranges read at once.

        One listing per part, in key order, each as soon as it is in (see
        :mod:`allocator.store.etcd.parts`); a compacted ``revision``
        raises :class:`~allocator.errors.Compacted`.
        """
        from allocator.store.etcd.parts import list_in_parts

        return list_in_parts(self, check_prefix(prefix), revision, splits)

    def list_runs(self, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        """One listing per run of key prefixes (in key order), as at ``revision``.

        Each run is one key range, from its first prefix through the end of
        its last, read as :meth:`list_parts` reads its parts; the keys
        between that are under none of the run's prefixes are left out.
        """
        from allocator.store.etcd.parts import list_in_ranges
        from allocator.store.parts import under_any

        spans = [
            (check_prefix(run[0]).encode(), prefix_range_end(check_prefix(run[-1]).encode()))
            for run in runs
        ]
        listings = list_in_ranges(self, spans, revision)
        return (under_any(listing, run) for run, listing in zip(runs, listings, strict=True))

    def list_pages(self, prefix: str, revision: int, page_keys: int) -> Iterator[Listing]:
        """Every key under ``prefix`` as at ``revision``: one range request per ``page_keys`` keys.

        Each request is well within a call's budget, however large the
        prefix; a compacted ``revision`` raises :class:`~allocator.errors.Compacted`.
        """
        from allocator.store.etcd.parts import list_in_pages

        return list_in_pages(self, check_prefix(prefix), revision, page_keys)

    def read_range(self, request: Json) -> Listing:
        """One range request's keys, with failover and the call's budget, as every call.

        A request for a compacted revision raises :class:`~allocator.errors.Compacted`
        (no other endpoint would answer it either).
        """

        def send(endpoint: Endpoint, until: float) -> Listing:
            try:
                return endpoint.post_as("/v3/kv/range", request, until, range_listing)
            except EtcdStatus as exc:
                if exc.code == Code.OUT_OF_RANGE and "compacted" in exc.details:
                    raise Compacted(
                        f"etcd at {endpoint.name}: {exc.details}", compact_revision=0
                    ) from None
                raise

        return self._calls.run(send, idempotent=True)

    def spare_connection(self) -> Endpoint:
        """A second connection to the endpoint in use, carrying its login token (not yet open).

        For reads made beside the store's own connection; the caller closes it.
        """
        return self._calls.spare_connection()

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
        request: Json = {"key": b64(key), "value": b64(value)}
        if _lease_of(lease):
            request["lease"] = str(lease)
        with self._naming("put", key):
            return _revision(self._calls.call("/v3/kv/put", request))

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        reply = self._txn(compares, [Delete(key)])
        responses = reply.get("responses") or [{}]
        return bool(int((responses[0].get("response_delete_range") or {}).get("deleted") or 0))

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` at one revision if every compare holds, else ``CasConflict``."""
        return _revision(self._txn(compares, ops))

    def _txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> Json:
        check_txn(compares, ops, self.max_txn_ops)
        reply = self._txn_call(txn_request(compares, ops), (compares, ops, ()))
        if not reply.get("succeeded"):
            raise conflict_of(compares, reply)
        return reply

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One listing per item of ``reads``: one transaction of range reads, at one revision."""
        check_reads(reads)
        request = {"success": read_ops(reads)}
        reply = self._txn_call(request, ((), (), reads), idempotent=True)
        return listings_of(reply.get("responses") or [], _revision(reply))

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``txn``; when a compare fails, the ``reads`` from the same request's failure branch."""
        check_txn(compares, ops, self.max_txn_ops)
        check_reads(reads)
        reply = self._txn_call(txn_request(compares, ops, reads), (compares, ops, reads))
        if reply.get("succeeded"):
            return TxnOutcome(True, _revision(reply))
        changed = conflict_of(compares, reply).keys
        found = listings_of((reply.get("responses") or [])[len(compares) :], _revision(reply))
        return TxnOutcome(False, _revision(reply), changed, found)

    def _txn_call(
        self,
        request: Json,
        txn: tuple[Sequence[Compare], Sequence[Op], Sequence[Read]],
        *,
        idempotent: bool = False,
    ) -> Json:
        """One transaction; a refusal names the operation and key etcd refused."""
        try:
            return self._calls.call("/v3/kv/txn", request, idempotent=idempotent)
        except PermissionDenied as exc:
            from allocator.store.etcd.refusals import refused_txn

            def probe(body: Json) -> object:
                return self._calls.call("/v3/kv/txn", body, idempotent=True)

            raise refused_txn(exc, probe, txn, self.config.username) from exc

    @contextlib.contextmanager
    def _naming(self, verb: str, key: str, *, prefix: bool = False) -> Iterator[None]:
        """A refusal inside names ``verb`` and ``key`` (etcd's says only "permission denied")."""
        try:
            yield
        except PermissionDenied as exc:
            from allocator.store.etcd.refusals import is_refusal, named

            if not is_refusal(exc):
                raise
            raise named(exc, verb, key, self.config.username, prefix=prefix) from exc

    # --- watches -------------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Watch ``prefix`` for changes at ``start_revision`` and later.

        Raises ``StoreUnavailable``/``PermissionDenied`` if the watch cannot
        be created; a compacted start revision is raised by ``next()``.
        """
        from allocator.store.etcd.watch import EtcdWatch, open_watch_stream

        request = watch_request(check_prefix(prefix), start_revision)
        with self._naming("watch", prefix, prefix=True):
            opened = self._calls.run(lambda ep, until: open_watch_stream(ep, request, until), True)
        watch = EtcdWatch(opened, self._forget)
        with self._lock:
            if self._calls.closed:
                watch.close()
                raise StoreError(f"the etcd store for {self.endpoints} is closed")
            self._watches.add(watch)
        watch.start()
        return watch

    def _forget(self, watch: EtcdWatch) -> None:
        with self._lock:
            self._watches.discard(watch)

    # --- leases --------------------------------------------------------------

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds (rounded up: etcd counts whole seconds)."""
        seconds = max(1, -int(-check_ttl(ttl) // 1))
        reply = self._calls.call("/v3/lease/grant", {"TTL": str(seconds)})
        if reply.get("error"):
            raise StoreError(f"etcd at {self.endpoints}: lease grant failed: {reply['error']}")
        return int(reply["ID"])

    def refresh_lease(self, lease: int) -> None:
        """Send one keep-alive; ``LeaseLost`` if the lease expired or was revoked."""
        reply = self._calls.call("/v3/lease/keepalive", {"ID": str(lease)}, idempotent=True)
        result = reply.get("result") or {}
        if int(result.get("TTL") or 0) <= 0:
            raise LeaseLost(f"etcd at {self.endpoints}: lease {lease:x} has expired")

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys; no error if it is already gone."""
        with contextlib.suppress(LeaseLost):
            self._calls.call("/v3/lease/revoke", {"ID": str(lease)}, idempotent=True)

    # --- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every watch and the connection. Idempotent."""
        with self._lock:
            if self._calls.closed:
                return
            self._calls.closed = True
            watches, self._watches = list(self._watches), set()
        for watch in watches:
            watch.close()
        self._calls.close_connection()

    def __enter__(self) -> EtcdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _revision(reply: Json) -> int:
    return int((reply.get("header") or {}).get("revision") or 0)


if TYPE_CHECKING:  # mypy checks the class against the protocol
    _STORE: type[Store] = EtcdStore
