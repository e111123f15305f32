"""The Consul KV backend (``consul://host:8500``, ``consuls://`` for TLS).

The store's operations; py-consul's client and its errors are
:mod:`allocator.store.consul.connection`, the writes
:mod:`allocator.store.consul.writes`, the pure parts
:mod:`allocator.store.consul.payloads` and :mod:`allocator.store.consul.config`.
Store semantics map onto Consul so:

* Keys: Store keys start with ``/``, Consul keys must not; ``/allocator/v1/x``
  is ``allocator/v1/x`` in Consul. Nothing outside the backend sees that.
* Revision = Consul's raft index; mod_revision = ``ModifyIndex``,
  create_revision = ``CreateIndex``. Writes go through ``/v1/txn``, whose
  results carry each written key's ``ModifyIndex``, so a put or transaction
  returns the exact revision of its write (random ``Flags`` on every write
  stop Consul from skipping one that changes nothing). A transaction of
  deletes only has no result to read its index from: it reports the index
  of a read of the first deleted key right after, which is the delete's
  unless something newer touched that key.
* Compare-and-swap: ``check-index`` / ``check-not-exists`` operations in the
  same transaction, all or nothing; a 409's ``Errors`` (``OpIndex``) name
  the keys of :class:`~allocator.errors.CasConflict`.
* A value whose transaction body would pass Consul's 512 KiB request limit
  (base64 grows it by a third) goes through ``PUT /v1/kv`` (``?cas=``,
  ``?acquire=``) and its revision is read back.
* ``list`` is one ``?recurse`` read with ``?consistent``. Its revision is
  the store's: Consul's index for a prefix only covers the prefix, so the KV
  index is read just before (see :meth:`ConsulStore.list`).
* Leases are sessions with ``Behavior=delete``, a TTL and no lock-delay;
  leased keys are written with the ``lock`` verb, and a put with a lease
  takes a key over from another session. Consul accepts TTLs of 10 s..24 h,
  so a shorter TTL becomes 10 s; Consul may invalidate a session up to twice
  its TTL after the last renewal. A lease id is the session UUID as an int.
* Watches: :class:`~allocator.store.consul.payloads.ConsulWatch`. Consul
  keeps no history: a watch delivers the versions it sees, not every one,
  and finds deletes made before it started by comparing with a listing of
  the prefix at ``start - 1`` (recorded by ``list`` and by earlier watches,
  shared by the handles of one process); without one it raises
  ``Compacted`` instead of missing a delete.

Known differences from etcd: a put without a lease on a key a lease holds
leaves it attached to that lease (Consul keeps a key's lock holder on a
plain write); a failed write still uses up a raft index.
"""

from __future__ import annotations

import base64
import json
import math
import os
import uuid
from collections.abc import Iterator, Sequence

from allocator.errors import CasConflict, InvalidInput, LeaseLost, StoreUnavailable, ValueTooLarge
from allocator.store import local
from allocator.store.base import (
    Compare,
    Delete,
    KeyValue,
    Listing,
    Op,
    Put,
    Read,
    TxnOutcome,
    read_each,
    txn_then_read,
)
from allocator.store.consul.config import ConsulConfig, parse_consul_url
from allocator.store.consul.connection import Client
from allocator.store.consul.payloads import (
    Baselines,
    ConsulWatch,
    Item,
    consul_key,
    key_value,
    session_id,
)
from allocator.store.consul.writes import (
    INDEX_PROBE,
    MAX_TXN_OPS,
    TXN_BODY_LIMIT,
    TxnTooLarge,
    put_large,
    read_key,
    write,
)
from allocator.store.parts import pages_of_whole, parts_of_whole, runs_read_each
from allocator.store.urls import redact_url

__all__ = ["MAX_TXN_OPS", "ConsulStore", "ConsulWatch", "open_consul"]

MIN_TTL_S = 10
MAX_TTL_S = 86400
CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 10.0
WATCH_MIN_INTERVAL_S = 1.0
_DELETE_ATTEMPTS = 16


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


# Shared by every handle of this process (keyed by address and token): the agent
# lists on one handle and watches on others.
_BASELINES: dict[tuple[str, str | None], Baselines] = {}


def _baselines_for(config: ConsulConfig) -> Baselines:
    key = (config.address, config.token)
    found = _BASELINES.get(key)
    if found is None:
        found = _BASELINES.setdefault(key, Baselines())
    return found


class ConsulStore:
    """A :class:`~allocator.store.base.Store` on Consul's KV (see the module doc)."""

    max_txn_ops: int | None = MAX_TXN_OPS

    def __init__(
        self,
        url: str,
        config: ConsulConfig,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        watch_min_interval: float = WATCH_MIN_INTERVAL_S,
    ) -> None:
        from allocator.store.credentials import remember_secret

        remember_secret(config.token)
        self.url = redact_url(url)
        self.config = config
        self._baselines = _baselines_for(config)
        self._timeouts = (connect_timeout, request_timeout)
        self._watch_min_interval = watch_min_interval
        self._client: Client | None = Client(config, self._timeouts)
        self._watches: list[ConsulWatch] = []

    def _live(self) -> Client:
        if self._client is None:
            raise StoreUnavailable(f"store {self.url} is closed")
        return self._client

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key`` (a consistent read), or ``None``."""
        return read_key(self._live(), key)

    def list(self, prefix: str, *, limit: int | None = None, descending: bool = False) -> Listing:
        """Every key under ``prefix``, sorted, in one consistent read, and the revision.

        A prefix read's ``X-Consul-Index`` only covers that prefix, so the
        store revision is read first, from a key that does not exist (Consul
        then answers with its KV index), and the larger of the two returned.
        Read first, it can only be older than the listing: a watch from it
        + 1 may replay a key the listing already showed, never miss one.
        ``limit`` (up to one transaction's operations): Consul's reads have
        none, so the key names are listed and the chosen keys' values read
        in one transaction (:meth:`_list_some`).
        """
        if limit is not None and local.check_limit(limit) and limit <= MAX_TXN_OPS:
            found = self._list_some(prefix, limit, descending)
            if found is not None:
                return found
        listing = self._list_all(prefix)
        items = listing.items[::-1] if descending else listing.items
        return Listing(items[:limit], listing.revision)

    def _list_some(self, prefix: str, limit: int, descending: bool) -> Listing | None:
        """The first ``limit`` keys under ``prefix``: names, then their values, both consistent.

        ``None`` when a chosen key went in between (its ``get`` failed the
        transaction): the caller reads the whole prefix instead.
        """
        name = consul_key(prefix, "prefix")
        client = self._live()
        with client.call(f"list {prefix}"):
            index, names = client.kv.get(name, keys=True, consistency="consistent")
        chosen = sorted(names or (), reverse=descending)[:limit]
        if not chosen:
            return Listing((), int(index))
        payload = [{"KV": {"Verb": "get", "Key": key}} for key in chosen]
        with client.call(f"list {prefix}"):
            code, reply = client.post_txn(json.dumps(payload))
        if code != 200:
            return None
        items = [dict(r["KV"], Value=_unb64(r["KV"].get("Value"))) for r in reply["Results"]]
        revision = max([int(index), *(int(item["ModifyIndex"]) for item in items)])
        return Listing(tuple(key_value(item) for item in items), revision)

    def _list_all(self, prefix: str) -> Listing:
        name = consul_key(prefix, "prefix")
        client = self._live()
        with client.call(f"list {prefix}"):
            store_index, _ = client.kv.get(name + INDEX_PROBE, consistency="consistent")
            index, items = client.kv.get(name, recurse=True, consistency="consistent")
        found = sorted((key_value(item) for item in items or ()), key=lambda kv: kv.key)
        revision = max(int(index), int(store_index))
        known = {str(item["Key"]): int(item["ModifyIndex"]) for item in items or ()}
        self._baselines.record(prefix, revision, revision, known)
        return Listing(tuple(found), revision)

    def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_revision: int | None = None,
        lease: int | None = None,
    ) -> int:
        """Write ``key`` (conditionally with ``expect_revision``); return its revision."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        op = Put(key, value, lease)
        local.check_txn(compares, [op], self.max_txn_ops)
        try:
            return write(self._live(), compares, [op], f"write {key}")
        except TxnTooLarge:
            return put_large(self._live(), key, value, expect_revision, local.lease_of(lease))

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed (conditionally with ``expect_revision``)."""
        if expect_revision is not None:
            local.check_txn([Compare(key, expect_revision)], [Delete(key)], self.max_txn_ops)
            if expect_revision == 0:  # "must be absent": there is nothing to delete
                found = self.get(key)
                if found is not None:
                    at = f"found at revision {found.mod_revision}"
                    raise CasConflict(f"compare failed: {key} expected absent, {at}", keys=(key,))
                return False
            write(self._live(), [Compare(key, expect_revision)], [Delete(key)], f"delete {key}")
            return True
        for _ in range(_DELETE_ATTEMPTS):
            found = self.get(key)
            if found is None:
                return False
            try:
                guard = [Compare(key, found.mod_revision)]
                write(self._live(), guard, [Delete(key)], f"delete {key}")
                return True
            except CasConflict:
                continue  # changed between read and delete: look again
        raise CasConflict(f"{key} kept changing while it was being deleted", keys=(key,))

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if every compare holds; return the revision."""
        local.check_txn(compares, ops, self.max_txn_ops)
        try:
            return write(self._live(), compares, ops, "apply a transaction")
        except TxnTooLarge as exc:
            raise ValueTooLarge(
                f"transaction is {exc.size} bytes as Consul JSON; Consul accepts at most "
                f"{TXN_BODY_LIMIT} bytes (write large values with a single put)"
            ) from exc

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One listing per item of ``reads`` (one request each)."""
        return read_each(self, reads)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``txn``; when a compare fails, the ``reads`` instead of ``CasConflict``."""
        return txn_then_read(self, compares, ops, reads)

    def list_parts(
        self, prefix: str, revision: int, splits: Sequence[str] = ()
    ) -> Iterator[Listing]:
        """Every key under ``prefix`` as it is now (Consul keeps no past), cut at ``splits``."""
        return parts_of_whole(self, prefix, splits)

    def list_runs(self, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        """Every key under each run's prefixes as it is now, one listing per run (see Store)."""
        return runs_read_each(self, runs, revision)

    def list_pages(self, prefix: str, revision: int, page_keys: int) -> Iterator[Listing]:
        """Every key under ``prefix`` as it is now, ``page_keys`` to a listing (see Store)."""
        return pages_of_whole(self, prefix, page_keys)

    def watch(self, prefix: str, start_revision: int) -> ConsulWatch:
        """Watch ``prefix`` for changes with revision >= ``start_revision`` (<= 0: from now).

        The watch has a connection of its own, so a blocking query never holds
        up the store's other calls; see :class:`ConsulWatch` for what Consul
        can and cannot replay.
        """
        name = consul_key(prefix, "prefix")
        if not isinstance(start_revision, int):
            raise InvalidInput(f"watch start revision {start_revision!r} must be an integer")
        self._live()
        client = Client(self.config, self._timeouts)

        def query(index: int, wait: float) -> tuple[int, list[Item]]:
            with client.call(f"watch {prefix}"):
                found, items = client.kv.get(
                    name,
                    recurse=True,
                    index=index or None,
                    wait=f"{max(1, round(wait * 1000))}ms" if index else None,
                )
            return int(found), list(items or ())

        try:
            watch = ConsulWatch(
                query,
                prefix,
                start_revision,
                on_close=client.close,
                min_interval=self._watch_min_interval,
                baselines=self._baselines,
            )
        except BaseException:
            client.close()
            raise
        self._watches = [w for w in self._watches if not w.closed] + [watch]
        return watch

    def grant_lease(self, ttl: float) -> int:
        """Create a session of ``ttl`` seconds (at least Consul's 10 s); return its id."""
        seconds = max(MIN_TTL_S, math.ceil(local.check_ttl(ttl)))
        if seconds > MAX_TTL_S:
            raise InvalidInput(f"lease TTL {ttl} s is longer than Consul's limit of {MAX_TTL_S} s")
        client = self._live()
        with client.call("create a session"):
            sid = client.session.create(
                name="allocator", behavior="delete", ttl=seconds, lock_delay=0
            )
        return uuid.UUID(str(sid)).int

    def refresh_lease(self, lease: int) -> None:
        """Renew the session; raise ``LeaseLost`` if Consul no longer has it."""
        sid, client = session_id(lease), self._live()
        with client.call(f"renew lease {lease}"):
            client.renew(sid, lease)

    def revoke_lease(self, lease: int) -> None:
        """Destroy the session, deleting its keys. No error if it is already gone."""
        try:
            sid = session_id(lease)
        except LeaseLost:
            return
        client = self._live()
        with client.call(f"revoke lease {lease}"):
            client.session.destroy(sid)

    def close(self) -> None:
        """Close every watch and the connection pool. Idempotent."""
        for watch in self._watches:
            watch.close()
        self._watches.clear()
        client, self._client = self._client, None
        if client is not None:
            client.close()


def open_consul(url: str, *, create: bool = False) -> ConsulStore:
    """Open the Consul store at ``url``, honouring Consul's environment variables.

    ``create`` is accepted for the common factory signature (a Consul
    cluster always exists).
    """
    return ConsulStore(url, parse_consul_url(url, os.environ))
