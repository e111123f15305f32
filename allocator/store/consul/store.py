"""The Consul KV backend (``consul://host:8500``, ``consuls://`` for TLS).

The only module that imports ``consul`` (py-consul, whose HTTP layer is
requests); the pure parts live in :mod:`allocator.store.consul.payloads` and
:mod:`allocator.store.consul.config`. Store semantics map onto Consul so:

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
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import consul
import consul.std
import requests
import urllib3

from allocator.errors import (
    AmbiguousWrite,
    CasConflict,
    InvalidInput,
    LeaseLost,
    PermissionDenied,
    StoreConfigError,
    StoreUnavailable,
    ValueTooLarge,
)
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
from allocator.store.consul.payloads import (
    Baselines,
    ConsulWatch,
    Item,
    LockHeld,
    Payload,
    consul_key,
    guard_op,
    key_value,
    random_flags,
    session_id,
    take_over,
    txn_failure,
    write_op,
)
from allocator.store.urls import redact_url

__all__ = ["MAX_TXN_OPS", "ConsulStore", "ConsulWatch", "open_consul"]

#: Consul's limit on operations (checks and writes) in one /v1/txn.
MAX_TXN_OPS = 64

MIN_TTL_S = 10
MAX_TTL_S = 86400
#: Consul's default txn_max_req_len: the largest /v1/txn body it accepts.
TXN_BODY_LIMIT = 512 * 1024
CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 10.0
WATCH_MIN_INTERVAL_S = 1.0
_DELETE_ATTEMPTS = 16
#: A key name nothing writes: reading it (absent) yields Consul's KV index.
_INDEX_PROBE = ".allocator-index-probe"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return "no answer in time"
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
    return found.group(1) if found else str(exc)[:200]


def _may_have_been_sent(exc: requests.exceptions.RequestException) -> bool:
    """Whether a request that failed with ``exc`` may have reached Consul."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    if isinstance(exc, requests.exceptions.Timeout):
        return True  # sent, but the answer did not come in time
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = getattr(exc.args[0] if exc.args else None, "reason", None)
        return not isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


@contextmanager
def _translated(address: str, what: str, *, write: bool = False) -> Iterator[None]:
    """Turn requests' and py-consul's errors into allocator's, naming the address.

    A ``write`` whose request may have reached Consul before the connection
    failed raises ``AmbiguousWrite``: it may have been applied.
    """
    try:
        yield
    except requests.exceptions.SSLError as exc:
        raise StoreConfigError(f"TLS with Consul at {address} failed: {_reason(exc)}") from exc
    except (requests.exceptions.InvalidURL, requests.exceptions.InvalidHeader) as exc:
        raise StoreConfigError(f"cannot send a request to Consul at {address}: {exc}") from exc
    except requests.exceptions.RequestException as exc:
        if write and _may_have_been_sent(exc):
            raise AmbiguousWrite(
                f"Consul at {address} did not confirm the write ({what}): {_reason(exc)}; "
                "it may have been applied; re-run to check"
            ) from exc
        raise StoreUnavailable(
            f"Consul at {address} is unreachable ({what}): {_reason(exc)}"
        ) from exc
    except consul.ACLPermissionDenied as exc:
        raise PermissionDenied(f"Consul at {address} refused to {what}: {exc}") from exc
    except consul.ConsulException as exc:
        text = str(exc)
        if text.startswith("413"):
            raise ValueTooLarge(f"Consul at {address} refused to {what}: {text}") from exc
        if text[:1] == "5" or text.startswith("429"):  # server trouble or rate limiting
            raise StoreUnavailable(f"Consul at {address} failed to {what}: {text}") from exc
        # Consul answers what allocator sends with 200, 403, 404, 409 or 413: anything
        # else comes from something that is not a Consul agent (or one behind a proxy).
        raise StoreUnavailable(
            f"Consul at {address} could not {what}: {text[:200]} (is it a Consul agent?)"
        ) from exc


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _txn_reply(response: Any) -> tuple[int, Any]:
    """py-consul callback keeping a 409's body (its own raises without the errors)."""
    if response.code in (200, 409):
        return response.code, json.loads(response.body)
    if response.code == 403:
        raise consul.ACLPermissionDenied(response.body)
    raise consul.ConsulException(f"{response.code} {response.body}")


class _TxnTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


# --- the HTTP client ---------------------------------------------------------------


class _HTTPClient(consul.std.HTTPClient):  # type: ignore[misc]
    """py-consul's requests client with a short connect timeout.

    A blocking query's read timeout grows by its ``wait`` plus the wait/16
    jitter Consul may add, so a silent server raises instead of hanging.
    """

    def __init__(self, *args: Any, timeouts: tuple[float, float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timeouts = timeouts

    def timeout(self, params: Any) -> tuple[float, float]:
        """(connect, read) timeouts for a request with these query ``params``."""
        connect, read = self._timeouts
        wait = dict(params or ()).get("wait")
        if wait:
            seconds = consul.std.parse_duration(str(wait))
            read += seconds + seconds / 16
        return connect, read


class _Client(consul.Consul):  # type: ignore[misc]
    def __init__(self, config: ConsulConfig, timeouts: tuple[float, float]) -> None:
        self._timeouts = timeouts
        super().__init__(
            host=f"[{config.host}]" if ":" in config.host else config.host,  # IPv6 literal
            port=config.port,
            scheme=config.scheme,
            verify=config.verify,
            cert=config.cert,
        )
        self.token = config.token  # py-consul would let the environment override it

    def http_connect(
        self, host: str, port: int, scheme: str, verify: bool | str = True, cert: Any = None
    ) -> _HTTPClient:
        """py-consul's hook for its HTTP client: ours carries the connect/read timeouts."""
        return _HTTPClient(host, port, scheme, verify, cert, timeouts=self._timeouts)

    def close(self) -> None:
        """Close the HTTP session (py-consul's own close() leaves it open)."""
        self.http.session.close()


# --- the store ---------------------------------------------------------------------


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
        self._client: _Client | None = _Client(config, self._timeouts)
        self._watches: list[ConsulWatch] = []

    def _live(self) -> _Client:
        if self._client is None:
            raise StoreUnavailable(f"store {self.url} is closed")
        return self._client

    def _call(self, what: str, *, write: bool = False) -> AbstractContextManager[None]:
        return _translated(self.config.address, what, write=write)

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key`` (a consistent read), or ``None``."""
        name = consul_key(key)
        client = self._live()
        with self._call(f"read {key}"):
            _, item = client.kv.get(name, consistency="consistent")
        return key_value(item) if item else None

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
        with self._call(f"list {prefix}"):
            index, names = client.kv.get(name, keys=True, consistency="consistent")
        chosen = sorted(names or (), reverse=descending)[:limit]
        if not chosen:
            return Listing((), int(index))
        payload = [{"KV": {"Verb": "get", "Key": key}} for key in chosen]
        with self._call(f"list {prefix}"):
            code, reply = client.http.put(
                _txn_reply, "/v1/txn", data=json.dumps(payload), headers=client.prepare_headers()
            )
        if code != 200:
            return None
        items = [dict(r["KV"], Value=_unb64(r["KV"].get("Value"))) for r in reply["Results"]]
        revision = max([int(index), *(int(item["ModifyIndex"]) for item in items)])
        return Listing(tuple(key_value(item) for item in items), revision)

    def _list_all(self, prefix: str) -> Listing:
        name = consul_key(prefix, "prefix")
        client = self._live()
        with self._call(f"list {prefix}"):
            store_index, _ = client.kv.get(name + _INDEX_PROBE, consistency="consistent")
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
            return self._write(compares, [op], f"write {key}")
        except _TxnTooLarge:
            return self._put_large(key, value, expect_revision, local.lease_of(lease))

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
            self._write([Compare(key, expect_revision)], [Delete(key)], f"delete {key}")
            return True
        for _ in range(_DELETE_ATTEMPTS):
            found = self.get(key)
            if found is None:
                return False
            try:
                self._write([Compare(key, found.mod_revision)], [Delete(key)], f"delete {key}")
                return True
            except CasConflict:
                continue  # changed between read and delete: look again
        raise CasConflict(f"{key} kept changing while it was being deleted", keys=(key,))

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if every compare holds; return the revision."""
        local.check_txn(compares, ops, self.max_txn_ops)
        try:
            return self._write(compares, ops, "apply a transaction")
        except _TxnTooLarge as exc:
            raise ValueTooLarge(
                f"transaction is {exc.size} bytes as Consul JSON; Consul accepts at most "
                f"{TXN_BODY_LIMIT} bytes (write large values with a single put)"
            ) from exc

    def _write(self, compares: Sequence[Compare], ops: Sequence[Op], what: str) -> int:
        """Send compares + ops as one /v1/txn; return the revision it wrote at."""
        payload = [guard_op(c.key, c.mod_revision) for c in compares]
        payload += [write_op(op) for op in ops]
        keys = [c.key for c in compares] + [op.key for op in ops]
        try:
            results = self._send_txn(payload, keys, what)
        except LockHeld as held:
            results = self._send_txn(*self._take_over(payload, keys, held.keys), what)
        indexes = [int(r["KV"]["ModifyIndex"]) for r in results if r.get("KV")]
        if any(isinstance(op, Put) for op in ops):
            return max(indexes)
        if ops:  # deletes only: no result carries the index
            return self._read_index(ops[0].key, what)
        with self._call(what):  # compares only: Consul ran them as a read
            index, _ = self._live().kv.get(_INDEX_PROBE, consistency="consistent")
        return int(index)

    def _send_txn(self, payload: Payload, keys: Sequence[str], what: str) -> Any:
        body = json.dumps(payload)
        if len(body) > TXN_BODY_LIMIT:
            raise _TxnTooLarge(len(body))
        if len(payload) > MAX_TXN_OPS:  # a takeover's unlocks can add operations
            raise ValueTooLarge(
                f"transaction needs {len(payload)} Consul operations; Consul accepts at most "
                f"{MAX_TXN_OPS}"
            )
        client = self._live()
        # py-consul's txn.put sends no ACL token, so this goes through its HTTP client.
        with self._call(what, write=True):
            code, reply = client.http.put(
                _txn_reply, "/v1/txn", data=body, headers=client.prepare_headers()
            )
        if code == 200:
            return reply.get("Results") or []
        raise txn_failure(self.config.address, payload, keys, reply.get("Errors"))

    def _take_over(
        self, payload: Payload, keys: Sequence[str], held: Sequence[str]
    ) -> tuple[Payload, Sequence[str]]:
        """The payload again, unlocking ``held`` keys from their current sessions first."""
        holders = {}
        for key in held:
            found = self.get(key)
            if found is None or found.lease is None:
                raise CasConflict(f"{key} changed while moving it to another lease", keys=(key,))
            holders[key] = session_id(found.lease)
        return take_over(payload, keys, holders)

    def _read_index(self, key: str, what: str) -> int:
        """Consul's index for ``key`` and the keys under it (one level of key names)."""
        client = self._live()
        with self._call(what):
            index, _ = client.kv.get(consul_key(key, "prefix"), keys=True, separator="/")
        return int(index)

    def _put_large(self, key: str, value: bytes, expect: int | None, lease: int | None) -> int:
        """Write a value too big for a transaction body through ``PUT /v1/kv``."""
        if expect is not None and lease is not None:
            raise ValueTooLarge(
                f"value for {key} is {len(value)} bytes: Consul writes values this large only "
                "through /v1/kv, which cannot combine expect_revision with a lease"
            )
        client, name = self._live(), consul_key(key)
        session = session_id(lease) if lease is not None else None
        flags = random_flags()
        with self._call(f"write {key}", write=True):
            try:
                done = client.kv.put(name, value, cas=expect, flags=flags, acquire=session)
            except consul.ConsulException as exc:
                if "session" in str(exc):
                    raise LeaseLost(f"cannot write {key}: lease {lease} is gone") from exc
                raise
        if not done:
            raise CasConflict(
                f"compare failed: {key} changed or is held by another lease", keys=(key,)
            )
        found = self.get(key)
        # The write's own index, unless a newer write to the key landed first.
        return found.mod_revision if found else self._read_index(key, f"write {key}")

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One listing per item of ``reads`` (one request each)."""
        return read_each(self, reads)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``txn``; when a compare fails, the ``reads`` instead of ``CasConflict``."""
        return txn_then_read(self, compares, ops, reads)

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
        client = _Client(self.config, self._timeouts)

        def query(index: int, wait: float) -> tuple[int, list[Item]]:
            with self._call(f"watch {prefix}"):
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
        with self._call("create a session"):
            sid = client.session.create(
                name="allocator", behavior="delete", ttl=seconds, lock_delay=0
            )
        return uuid.UUID(str(sid)).int

    def refresh_lease(self, lease: int) -> None:
        """Renew the session; raise ``LeaseLost`` if Consul no longer has it."""
        sid, client = session_id(lease), self._live()
        with self._call(f"renew lease {lease}"):
            try:
                client.session.renew(sid)
            except consul.NotFound as exc:
                raise LeaseLost(f"lease {lease} expired or was revoked") from exc

    def revoke_lease(self, lease: int) -> None:
        """Destroy the session, deleting its keys. No error if it is already gone."""
        try:
            sid = session_id(lease)
        except LeaseLost:
            return
        client = self._live()
        with self._call(f"revoke lease {lease}"):
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
