"""A TEST DOUBLE of Consul's KV, transaction and session HTTP API. It is not Consul.

:class:`ConsulDouble` is a small threaded HTTP server on a free loopback port
that follows Consul's documented KV semantics closely enough for the Consul
backend to be tested without a Consul agent (none can be installed where the
tests run). What it models, after Consul's API docs and state store:

* one global raft index: every write request (KV PUT/DELETE, a transaction
  with a write verb, session create/destroy/invalidation) takes the next
  index, even when it changes nothing, as a raft apply does;
* ``GET /v1/kv/<key>`` with ``?recurse``, ``?keys`` (``?separator``), ``?raw``;
  404 with ``X-Consul-Index`` when nothing matches; entries carry
  ``CreateIndex``, ``ModifyIndex``, ``LockIndex``, ``Flags``, base64 ``Value``
  (``null`` when empty) and ``Session`` when locked;
* ``X-Consul-Index`` of a prefix read is the highest ``ModifyIndex`` under
  it, tombstones of deleted keys included, else the KV table index; of a
  single key its ``ModifyIndex``, else the table index; never below 1;
* blocking queries: ``?index=&wait=`` (Go durations, default 5m, at most
  10m) return as soon as that index exceeds ``index``, or after ``wait``;
  a snapshot restore wakes them at once (with a lower index);
* ``PUT`` with ``?cas=`` (0 = create only), ``?flags=``, ``?acquire=``,
  ``?release=``, answering ``true``/``false``; ``DELETE`` with ``?recurse``
  and ``?cas=``; a write that changes nothing keeps the old ``ModifyIndex``;
* ``PUT /v1/txn``: KV verbs set, cas, lock, unlock, get, get-tree,
  check-index, check-session, check-not-exists, delete, delete-tree,
  delete-cas; all or nothing; 200 with ``Results`` or 409 with ``Errors``
  (``OpIndex``, ``What``) for every failed operation; read-only transactions
  take no index; no results for deletes and check-not-exists;
* sessions: ``/v1/session/create`` (``TTL`` 10s..24h, ``Behavior``
  release|delete), ``renew`` (404 when gone), ``destroy``, ``info``, ``list``;
  a session not renewed within its TTL is invalidated, deleting (or
  releasing) the keys it holds;
* limits: values over 512 KiB and transaction bodies over 512 KiB get 413;
  at most 64 operations per transaction;
* ACLs (when ``acl_tokens`` is given): the token comes from
  ``X-Consul-Token``, ``Authorization: Bearer`` or ``?token=``; an unknown
  token gets 403 "ACL not found"; a missing one is anonymous and may do
  nothing ("Permission denied": 403, or a per-operation error in a txn);
  prefix reads silently leave out keys the token may not read.

Double-only knobs, not Consul behaviour: ``ttl_scale`` multiplies session
TTLs (0.1 turns the 10 s minimum into 1 s, so expiry tests are quick);
``early_return`` makes blocking queries answer at once without a change
(Consul documents that a blocking query may return without one);
``snapshot()``/``restore()`` put the KV state and raft index back, like a
raft snapshot restore, making indexes go backwards; ``requests`` logs every
request (method, path with query, headers). Not modelled: lock-delay,
tombstone reaping, wait jitter, the up-to-2x TTL grace, datacenters.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["ConsulDouble", "RecordedRequest", "Snapshot", "parse_duration"]

MAX_VALUE_BYTES = 512 * 1024
MAX_TXN_OPS = 64
_DEFAULT_WAIT_S = 300.0
_MAX_WAIT_S = 600.0
_WRITE_VERBS = {"set", "cas", "lock", "unlock", "delete", "delete-tree", "delete-cas"}
_DURATION = re.compile(r"(\d+(?:\.\d*)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

#: (HTTP status, JSON-able body / raw bytes / text, extra headers)
Reply = tuple[int, Any, dict[str, str]]


def parse_duration(text: str) -> float:
    """Parse a Go duration ("10s", "1500ms", "1m30s") into seconds; ValueError if malformed."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _quoted(key: str) -> str:
    return json.dumps(key)  # Go's %q, near enough for error messages


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored key, as Consul's state store keeps it."""

    key: str
    value: bytes
    flags: int
    create_index: int
    modify_index: int
    lock_index: int = 0
    session: str = ""

    def to_json(self, with_value: bool = True) -> dict[str, Any]:
        """The entry as Consul's API renders it."""
        out: dict[str, Any] = {
            "LockIndex": self.lock_index,
            "Key": self.key,
            "Flags": self.flags,
            "Value": base64.b64encode(self.value).decode() if with_value and self.value else None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }
        if self.session:
            out["Session"] = self.session
        return out


@dataclass(slots=True)
class _Session:
    id: str
    name: str
    behavior: str
    ttl: str
    create_index: int
    ttl_s: float | None
    expires_at: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "ID": self.id,
            "Name": self.name,
            "Node": "consul-double",
            "LockDelay": 0,
            "Behavior": self.behavior,
            "TTL": self.ttl,
            "NodeChecks": ["serfHealth"],
            "ServiceChecks": None,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.create_index,
        }


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the double received: method, path with its query, headers."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)


class _OpError(Exception):
    """A transaction operation failed; the message is Consul's ``What``."""


@dataclass(slots=True)
class _KV:
    """The KV tables: live entries, tombstones (key -> delete index), table index."""

    entries: dict[str, Entry] = field(default_factory=dict)
    graveyard: dict[str, int] = field(default_factory=dict)
    table_index: int = 0

    def prefix_index(self, prefix: str) -> int:
        """Consul's index for a prefix read: newest entry or tombstone, else the table's."""
        live = (e.modify_index for k, e in self.entries.items() if k.startswith(prefix))
        dead = (i for k, i in self.graveyard.items() if k.startswith(prefix))
        return max(max(live, default=0), max(dead, default=0)) or self.table_index

    def key_index(self, key: str) -> int:
        """Consul's index for a single-key read."""
        entry = self.entries.get(key)
        return entry.modify_index if entry else self.table_index


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The KV state and raft index at one moment (double-only, for ``restore``)."""

    index: int
    kv: _KV


class _Tx:
    """One write's scratch copy of the KV tables, applied atomically by ``ConsulDouble``."""

    def __init__(self, kv: _KV, idx: int, sessions: Mapping[str, _Session]) -> None:
        self.kv = _KV(dict(kv.entries), dict(kv.graveyard), kv.table_index)
        self.idx = idx
        self.sessions = sessions

    def set(self, new: Entry, update_session: bool = False) -> Entry:
        old = self.kv.entries.get(new.key)
        if not update_session:  # a plain write keeps the lock holder (kvsSetTxn)
            new = replace(
                new, session=old.session if old else "", lock_index=old.lock_index if old else 0
            )
        new = replace(
            new, create_index=old.create_index if old else self.idx, modify_index=self.idx
        )
        if old is not None and replace(old, modify_index=self.idx) == new:
            return old  # nothing changed: Consul skips the write and keeps ModifyIndex
        self.kv.entries[new.key] = new
        self.kv.table_index = self.idx
        return new

    def delete(self, key: str) -> None:
        if self.kv.entries.pop(key, None) is not None:
            self.kv.graveyard[key] = self.idx
            self.kv.table_index = self.idx

    def apply(self, verb: str, op: Entry) -> list[tuple[Entry, bool]]:
        """Run one KV verb; return (entry, with_value) results or raise ``_OpError``."""
        key, old = op.key, self.kv.entries.get(op.key)
        if verb == "set":
            return [(self.set(op), False)]
        if verb == "cas":
            if (op.modify_index == 0) != (old is None) or (
                old and old.modify_index != op.modify_index
            ):
                raise _OpError(f"failed to set key {_quoted(key)}, index is stale")
            return [(self.set(op), False)]
        if verb in ("lock", "unlock"):
            return [(self._lock(verb, op, old), False)]
        if verb in ("get", "check-index", "check-session"):
            if old is None:
                raise _OpError(f"key {_quoted(key)} doesn't exist")
            if verb == "check-index" and old.modify_index != op.modify_index:
                raise _OpError(
                    f"failed index check for key {_quoted(key)}, current modify index "
                    f"{old.modify_index} != {op.modify_index}"
                )
            if verb == "check-session" and old.session != op.session:
                raise _OpError(f"failed session check for key {_quoted(key)}")
            return [(old, verb == "get")]
        if verb == "get-tree":
            return [(e, True) for k, e in sorted(self.kv.entries.items()) if k.startswith(key)]
        if verb == "check-not-exists":
            if old is not None:
                raise _OpError(f"key {_quoted(key)} exists")
            return []
        if verb == "delete-cas" and old is not None and old.modify_index != op.modify_index:
            raise _OpError(f"failed to delete key {_quoted(key)}, index is stale")
        if verb in ("delete", "delete-cas"):
            self.delete(key)
            return []
        if verb == "delete-tree":
            for k in [k for k in self.kv.entries if k.startswith(key)]:
                self.delete(k)
            return []
        raise _OpError(f"unknown KV verb {_quoted(verb)}")

    def _lock(self, verb: str, op: Entry, old: Entry | None) -> Entry:
        if not op.session:
            raise _OpError("missing session")
        if verb == "unlock":
            if old is None or old.session != op.session:
                raise _OpError(
                    f"failed to unlock key {_quoted(op.key)}, lock isn't held, "
                    "or is held by another session"
                )
            return self.set(replace(op, session="", lock_index=old.lock_index), True)
        if op.session not in self.sessions:
            raise _OpError(f"invalid session {_quoted(op.session)}")
        if old is not None and old.session not in ("", op.session):
            raise _OpError(f"failed to lock key {_quoted(op.key)}, lock is already held")
        held = old is not None and old.session == op.session
        lock_index = (old.lock_index if old else 0) + (0 if held else 1)
        return self.set(replace(op, lock_index=lock_index), True)


class ConsulDouble:
    """A TEST DOUBLE of a Consul agent's HTTP API (see the module doc for what it models).

    ``acl_tokens`` maps each known token to the key prefix it may read and
    write (``""`` = every key); ``None`` turns ACLs off. ``ttl_scale`` is a
    double-only knob that scales session TTLs down for quick expiry tests.
    """

    def __init__(
        self, *, acl_tokens: Mapping[str, str] | None = None, ttl_scale: float = 1.0
    ) -> None:
        self.acl_tokens = dict(acl_tokens) if acl_tokens is not None else None
        self.ttl_scale = ttl_scale
        #: Double-only: blocking queries answer at once, as if woken without a change.
        self.early_return = False
        self._cond = threading.Condition()
        self._index = 0
        self._kv = _KV()
        self._sessions: dict[str, _Session] = {}
        self._restores = 0
        self._stopping = False
        self._log: list[RecordedRequest] = []
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []

    # --- lifecycle --------------------------------------------------------------

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` of the running double."""
        if self._server is None:
            raise RuntimeError("the Consul double is not started")
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        """The store URL that reaches this double: ``consul://127.0.0.1:PORT``."""
        return f"consul://{self.address}"

    def start(self, port: int = 0) -> None:
        """Listen on ``port`` (0: a free loopback port) and serve and expire sessions."""
        self._server = _Server(("127.0.0.1", port), _Handler, self)
        self._stopping = False
        self._threads = [
            threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},  # so stop() returns quickly
                name="consul-double",
                daemon=True,
            ),
            threading.Thread(target=self._expire_sessions, name="consul-double-ttl", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop serving; open connections (blocking queries included) are cut."""
        server, self._server = self._server, None
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if server is not None:
            server.shutdown()
            server.close_connections()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads = []

    def restart(self) -> None:
        """Stop, then serve again on the same port with the same data and sessions.

        Like a Consul agent that went away and came back: clients see their
        connections cut, then the same KV state and raft index. Sessions keep
        their deadlines, so one not renewed meanwhile expires on return.
        """
        port = int(self.address.rsplit(":", 1)[1])
        self.stop()
        self.start(port)

    def __enter__(self) -> ConsulDouble:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- double-only inspection and fault hooks ---------------------------------

    @property
    def index(self) -> int:
        """The current raft index."""
        with self._cond:
            return self._index

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first."""
        with self._cond:
            return list(self._log)

    def snapshot(self) -> Snapshot:
        """Capture the KV state and raft index, for :meth:`restore`."""
        with self._cond:
            return Snapshot(self._index, copy.deepcopy(self._kv))

    def restore(self, snapshot: Snapshot) -> None:
        """Put back a :meth:`snapshot`, like a raft snapshot restore: indexes go backwards."""
        with self._cond:
            self._index, self._kv = snapshot.index, copy.deepcopy(snapshot.kv)
            self._restores += 1
            self._cond.notify_all()

    # --- the HTTP API, called by the handler ------------------------------------

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        """Answer one request; ``target`` is the path with its query string."""
        parts = urlsplit(target)
        path, params = unquote(parts.path), dict(parse_qsl(parts.query, keep_blank_values=True))
        with self._cond:
            self._log.append(RecordedRequest(method, target, dict(headers)))
        token = headers.get("X-Consul-Token") or params.get("token")
        bearer = headers.get("Authorization", "")
        if not token and bearer.startswith("Bearer "):
            token = bearer[len("Bearer ") :]
        if self.acl_tokens is not None and token and token not in self.acl_tokens:
            return 403, "ACL not found", {}
        try:
            return self._route(method, path, params, body, token or None)
        except ValueError as exc:
            return 400, str(exc), {}

    def _route(
        self, method: str, path: str, params: dict[str, str], body: bytes, token: str | None
    ) -> Reply:
        if path.startswith("/v1/kv/"):
            key = path[len("/v1/kv/") :]
            if method == "GET":
                return self._kv_get(key, params, token)
            if method == "PUT":
                return self._kv_put(key, params, body, token)
            if method == "DELETE":
                return self._kv_delete(key, params, token)
        elif path == "/v1/txn" and method == "PUT":
            return self._txn(body, token)
        elif path.startswith("/v1/session/"):
            return self._session(method, path[len("/v1/session/") :], body, token)
        return 405 if path.startswith("/v1/kv/") else 404, f"no route for {method} {path}", {}

    def _may(self, token: str | None, key: str) -> bool:
        if self.acl_tokens is None:
            return True
        return token is not None and key.startswith(self.acl_tokens[token])

    def _next_index(self) -> int:
        self._index += 1
        return self._index

    def _commit(self, tx: _Tx) -> None:
        self._kv = tx.kv
        self._cond.notify_all()

    def _block(self, index_of: Callable[[], int], min_index: int, wait: float) -> None:
        """Wait (lock held) until ``index_of()`` exceeds ``min_index``, a restore, or ``wait``."""
        deadline = time.monotonic() + wait
        restores = self._restores
        while not self.early_return and not self._stopping and restores == self._restores:
            remaining = deadline - time.monotonic()
            if index_of() > min_index or remaining <= 0:
                return
            self._cond.wait(remaining)

    def _kv_get(self, key: str, params: dict[str, str], token: str | None) -> Reply:
        listing = "recurse" in params or "keys" in params
        if not key and not listing:
            raise ValueError("Missing key name")
        wait = min(
            parse_duration(params["wait"]) if params.get("wait") else _DEFAULT_WAIT_S, _MAX_WAIT_S
        )
        with self._cond:

            def index_of() -> int:
                return self._kv.prefix_index(key) if listing else self._kv.key_index(key)

            if int(params.get("index") or 0) > 0:
                self._block(index_of, int(params["index"]), wait)
            headers = {"X-Consul-Index": str(max(1, index_of())), "X-Consul-KnownLeader": "true"}
            if not listing:
                entry = self._kv.entries.get(key)
                if entry is not None and not self._may(token, key):
                    return 403, "Permission denied", headers
                if entry is None:
                    return 404, b"", headers
                return 200, (entry.value if "raw" in params else [entry.to_json()]), headers
            found = [e for k, e in sorted(self._kv.entries.items()) if k.startswith(key)]
            found = [e for e in found if self._may(token, e.key)]
        if not found and not (key == "" and "keys" in params):
            return 404, b"", headers  # Consul lists the root's keys as [] rather than 404
        if "keys" not in params:
            return 200, [e.to_json() for e in found], headers
        sep = params.get("separator", "")
        keys: list[str] = []
        for e in found:
            cut = e.key.find(sep, len(key)) if sep else -1
            rolled = e.key if cut < 0 else e.key[: cut + len(sep)]
            if not keys or keys[-1] != rolled:
                keys.append(rolled)
        return 200, keys, headers

    def _kv_put(self, key: str, params: dict[str, str], body: bytes, token: str | None) -> Reply:
        if not key:
            raise ValueError("Missing key name")
        if key.startswith("/"):
            raise ValueError("key must not begin with a '/'")
        if sum(f in params for f in ("cas", "acquire", "release")) > 1:
            raise ValueError("Conflicting flags: cas, acquire, release")
        if len(body) > MAX_VALUE_BYTES:
            return (
                413,
                f"Request body({len(body)} bytes) too large, max size: {MAX_VALUE_BYTES} bytes",
                {},
            )
        if not self._may(token, key):
            return 403, "Permission denied", {}
        op = Entry(key, body, int(params.get("flags") or 0), 0, int(params.get("cas") or 0))
        verb = "set"
        if "cas" in params:
            verb = "cas"
        elif "acquire" in params:
            verb, op = "lock", replace(op, session=params["acquire"])
        elif "release" in params:
            verb, op = "unlock", replace(op, session=params["release"])
        with self._cond:
            tx = _Tx(self._kv, self._next_index(), self._sessions)
            try:
                tx.apply(verb, op)
            except _OpError as exc:
                if "invalid session" in str(exc) or "missing session" in str(exc):
                    return 500, str(exc), {}
                return 200, False, {}
            self._commit(tx)
        return 200, True, {}

    def _kv_delete(self, key: str, params: dict[str, str], token: str | None) -> Reply:
        if "recurse" in params and "cas" in params:
            raise ValueError("Conflicting flags: recurse, cas")
        if not key and "recurse" not in params:
            raise ValueError("Missing key name")
        if not self._may(token, key):
            return 403, "Permission denied", {}
        verb = (
            "delete-tree" if "recurse" in params else "delete-cas" if "cas" in params else "delete"
        )
        with self._cond:
            tx = _Tx(self._kv, self._next_index(), self._sessions)
            try:
                tx.apply(verb, Entry(key, b"", 0, 0, int(params.get("cas") or 0)))
            except _OpError:
                return 200, False, {}
            self._commit(tx)
        return 200, True, {}

    def _txn(self, body: bytes, token: str | None) -> Reply:
        if len(body) > MAX_VALUE_BYTES:
            return 413, f"Request body too large, max size: {MAX_VALUE_BYTES} bytes", {}
        try:
            ops = [(_lower_keys(op["KV"])) for op in json.loads(body)]
            verbs = [str(op["verb"]) for op in ops]
            entries = [_op_entry(op) for op in ops]
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise ValueError(f"Failed to parse body: {exc}") from exc
        if len(ops) > MAX_TXN_OPS:
            return 413, f"Transaction contains too many operations ({len(ops)} > {MAX_TXN_OPS})", {}
        for e in entries:
            if len(e.value) > MAX_VALUE_BYTES:
                too_large = f"({len(e.value)} > {MAX_VALUE_BYTES} bytes)"
                return 413, f"Value for key {_quoted(e.key)} is too large {too_large}", {}
        writes = any(v in _WRITE_VERBS for v in verbs)
        with self._cond:
            tx = _Tx(self._kv, self._next_index() if writes else self._index, self._sessions)
            results: list[dict[str, Any]] = []
            errors: list[dict[str, Any]] = []
            for i, (verb, entry) in enumerate(zip(verbs, entries, strict=True)):
                try:
                    if not self._may(token, entry.key):
                        raise _OpError("Permission denied")
                    results += [{"KV": e.to_json(v)} for e, v in tx.apply(verb, entry)]
                except _OpError as exc:
                    errors.append({"OpIndex": i, "What": str(exc)})
            if errors:
                return 409, {"Results": None, "Errors": errors}, {}
            if writes:
                self._commit(tx)
        return 200, {"Results": results, "Errors": None}, {}

    def _session(self, method: str, action: str, body: bytes, token: str | None) -> Reply:
        if self.acl_tokens is not None and token is None:
            return 403, "Permission denied", {}
        verb, _, sid = action.partition("/")
        with self._cond:
            headers = {"X-Consul-Index": str(max(1, self._index))}
            if method == "PUT" and verb == "create":
                return 200, {"ID": self._create_session(body)}, {}
            if method == "PUT" and verb == "renew":
                session = self._sessions.get(sid)
                if session is None:
                    return 404, f"Session id '{sid}' not found", {}
                if session.ttl_s is not None:
                    session.expires_at = time.monotonic() + session.ttl_s
                    self._cond.notify_all()
                return 200, [session.to_json()], {}
            if method == "PUT" and verb == "destroy":
                self._invalidate(sid)
                return 200, True, {}
            if method == "GET" and verb == "info":
                found = self._sessions.get(sid)
                return 200, [found.to_json()] if found else [], headers
            if method == "GET" and verb == "list":
                return 200, [s.to_json() for s in self._sessions.values()], headers
        return 404, f"no route for {method} /v1/session/{action}", {}

    def _create_session(self, body: bytes) -> str:
        data = _lower_keys(json.loads(body)) if body.strip() else {}
        behavior = data.get("behavior") or "release"
        if behavior not in ("release", "delete"):
            raise ValueError(f"Invalid Behavior setting '{behavior}'")
        ttl = str(data.get("ttl") or "")
        ttl_s = parse_duration(ttl) if ttl else None
        if ttl_s is not None and not 10 <= ttl_s <= 86400:
            raise ValueError(f"Invalid Session TTL '{ttl}', must be between [10s=24h0m0s]")
        scaled = ttl_s * self.ttl_scale if ttl_s is not None else None
        session = _Session(
            id=str(uuid.uuid4()),
            name=str(data.get("name") or ""),
            behavior=behavior,
            ttl=ttl,
            create_index=self._next_index(),
            ttl_s=scaled,
            expires_at=time.monotonic() + scaled if scaled is not None else None,
        )
        self._sessions[session.id] = session
        self._cond.notify_all()
        return session.id

    def _invalidate(self, sid: str) -> None:
        """End session ``sid`` (lock held): delete or release the keys it holds."""
        session = self._sessions.pop(sid, None)
        if session is None:
            return
        tx = _Tx(self._kv, self._next_index(), self._sessions)
        for key, entry in list(tx.kv.entries.items()):
            if entry.session != sid:
                continue
            if session.behavior == "delete":
                tx.delete(key)
            else:
                tx.set(replace(entry, session=""), update_session=True)
        self._commit(tx)

    def _expire_sessions(self) -> None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                for s in [s for s in self._sessions.values() if s.expires_at is not None]:
                    if s.expires_at is not None and s.expires_at <= now:
                        self._invalidate(s.id)
                deadlines = [s.expires_at for s in self._sessions.values() if s.expires_at]
                self._cond.wait(min(deadlines) - now if deadlines else None)


def _lower_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Field names matched case-insensitively, as Go's JSON decoder does."""
    return {str(k).lower(): v for k, v in data.items()}


def _op_entry(op: Mapping[str, Any]) -> Entry:
    raw = op.get("value")
    value = base64.b64decode(raw, validate=True) if raw else b""
    entry = Entry(str(op["key"]), value, int(op.get("flags") or 0), 0, int(op.get("index") or 0))
    return replace(entry, session=str(op.get("session") or ""))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # like Go's listener; 5 would reset a burst of clients

    def __init__(
        self, address: tuple[str, int], handler: type[_Handler], double: ConsulDouble
    ) -> None:
        self.double = double
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, handler)

    def close_connections(self) -> None:
        """Cut every open client connection (keep-alive and in-flight)."""
        with self.sockets_lock:
            for sock in self.open_sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like Consul's Go server
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.sockets_lock:
            self.server.open_sockets.add(self.connection)

    def finish(self) -> None:
        with self.server.sockets_lock:
            self.server.open_sockets.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request stderr log; ``ConsulDouble.requests`` has it."""

    def _serve(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, payload, headers = self.server.double.handle(
            self.command, self.path, dict(self.headers.items()), body
        )
        if isinstance(payload, bytes):
            data, ctype = payload, "application/octet-stream"
        elif isinstance(payload, str):
            data, ctype = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json"
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client (or stop()) went away
