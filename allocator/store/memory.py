"""An in-process store with the full Store semantics, for tests.

``memory://NAME`` opens a store whose state is shared by every store opened
with the same NAME in this process (so tests can give each thread its own
store, like separate clients of one server); ``memory://`` alone opens a
fresh private store. Leases expire by an injectable clock; expired leases are
reaped lazily by any operation or waiting watch, like the SQLite store.
A transaction may hold at most :data:`~allocator.store.base.MAX_TXN_OPS`
operations, the smallest limit of any backend, so code tested here cannot
build a transaction Consul would refuse.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from allocator.errors import LeaseLost, StoreConfigError, StoreUnavailable
from allocator.store import local
from allocator.store.base import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    Event,
    KeyValue,
    Listing,
    Op,
    Put,
    Store,
    Watch,
)
from allocator.store.urls import redact_url

__all__ = ["MemoryStore", "open_memory"]

Clock = Callable[[], float]

_SCHEME = "memory://"
_NAMED: dict[str, _State] = {}
_NAMED_LOCK = threading.Lock()


@dataclass(slots=True)
class _Lease:
    ttl: float
    expires_at: float


class _State:
    """The data one or more MemoryStore handles share. Callers hold ``cond``."""

    def __init__(self, clock: Clock, history: int) -> None:
        self.cond = threading.Condition()
        self.clock = clock
        self.history = history
        self.revision = 0
        self.compact_revision = 0
        self.kv: dict[str, KeyValue] = {}
        self.events: list[Event] = []
        self.leases: dict[int, _Lease] = {}
        self.next_lease = 1

    def mod_revision_of(self, key: str) -> int:
        entry = self.kv.get(key)
        return entry.mod_revision if entry else 0

    def commit(self, changes: Sequence[Op]) -> int:
        """Apply ``changes`` (puts, deletes of existing keys) at one new revision."""
        self.revision += 1
        for op in changes:
            if isinstance(op, Put):
                old = self.kv.get(op.key)
                created = old.create_revision if old else self.revision
                lease = local.lease_of(op.lease)
                self.kv[op.key] = KeyValue(op.key, op.value, self.revision, created, lease)
                self.events.append(Event("put", op.key, op.value, self.revision))
            else:
                del self.kv[op.key]
                self.events.append(Event("delete", op.key, None, self.revision))
        self._trim()
        self.cond.notify_all()
        return self.revision

    def _trim(self) -> None:
        horizon = self.revision - self.history
        if horizon <= self.compact_revision:
            return
        cut = bisect.bisect_right(self.events, horizon, key=lambda e: e.revision)
        del self.events[:cut]
        self.compact_revision = horizon

    def end_lease(self, lease_id: int) -> None:
        """Forget ``lease_id`` and delete its keys at one revision (if it had any)."""
        self.leases.pop(lease_id, None)
        doomed = sorted(k for k, kv in self.kv.items() if kv.lease == lease_id)
        if doomed:
            self.commit([Delete(k) for k in doomed])

    def reap(self) -> None:
        """End every lease whose expiry time has passed."""
        now = self.clock()
        expired = sorted(
            (lease.expires_at, lid) for lid, lease in self.leases.items() if lease.expires_at <= now
        )
        for _, lease_id in expired:
            self.end_lease(lease_id)

    def seconds_to_next_expiry(self) -> float:
        """How long a watch may sleep before a lease could expire (and delete keys)."""
        if not self.leases:
            return float("inf")
        soonest = min(lease.expires_at for lease in self.leases.values())
        return max(soonest - self.clock(), 0.001)

    def events_since(self, cursor: int, prefix: str) -> list[Event]:
        """Logged events at revision >= ``cursor`` under ``prefix``, in order."""
        start = bisect.bisect_left(self.events, cursor, key=lambda e: e.revision)
        return [e for e in self.events[start:] if e.key.startswith(prefix)]


class _MemoryWatch:
    """A watch that waits on the shared state's condition variable."""

    def __init__(self, state: _State, prefix: str, cursor: int) -> None:
        self._state = state
        self._prefix = prefix
        self._cursor = cursor
        self._closed = False

    def next(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds; return the next batch of events."""
        deadline = time.monotonic() + max(timeout, 0.0)
        state = self._state
        with state.cond:
            while not self._closed:
                state.reap()
                local.check_not_compacted(self._cursor, state.compact_revision, self._prefix)
                events = state.events_since(self._cursor, self._prefix)
                self._cursor = max(self._cursor, state.revision + 1)
                if events:
                    return events
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                # Wake for the next lease expiry too: reaping is lazy.
                state.cond.wait(min(remaining, state.seconds_to_next_expiry()))
        return []

    def close(self) -> None:
        """Stop watching; a ``next`` blocked in another thread returns ``[]``."""
        with self._state.cond:
            self._closed = True
            self._state.cond.notify_all()


class MemoryStore(local.ConditionalWrites):
    """A Store kept in this process's memory (see the module docstring)."""

    max_txn_ops: int | None = MAX_TXN_OPS

    def __init__(
        self,
        url: str = _SCHEME,
        *,
        clock: Clock = time.monotonic,
        history: int = local.DEFAULT_HISTORY,
        state: _State | None = None,
    ) -> None:
        self.url = redact_url(url)
        self._state = state if state is not None else _State(clock, history)
        self._closed = False

    def _live(self) -> _State:
        if self._closed:
            raise StoreUnavailable(f"store {self.url} is closed")
        return self._state

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None`` if absent."""
        local.check_key(key)
        state = self._live()
        with state.cond:
            state.reap()
            return state.kv.get(key)

    def list(self, prefix: str, *, limit: int | None = None, descending: bool = False) -> Listing:
        """Every key starting with ``prefix`` (sorted; ``limit``, ``descending``: see Store)."""
        local.check_prefix(prefix)
        local.check_limit(limit)
        state = self._live()
        with state.cond:
            state.reap()
            keys = sorted((k for k in state.kv if k.startswith(prefix)), reverse=descending)
            return Listing(tuple(state.kv[k] for k in keys[:limit]), state.revision)

    def _apply(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        """Check and apply a write; return (store revision, number of keys changed)."""
        local.check_txn(compares, ops, self.max_txn_ops)
        state = self._live()
        with state.cond:
            state.reap()
            failed = local.failed_compares(compares, state.mod_revision_of)
            if failed:
                raise local.cas_conflict(compares, failed, state.mod_revision_of)
            for op in ops:
                lease = local.lease_of(op.lease) if isinstance(op, Put) else None
                if lease is not None and lease not in state.leases:
                    raise LeaseLost(
                        f"cannot put {op.key}: lease {lease} has expired or was revoked"
                    )
            changes = local.expand_deletes(
                ops, state.mod_revision_of, lambda p: sorted(k for k in state.kv if k.startswith(p))
            )
            if not changes:
                return state.revision, 0
            return state.commit(changes), len(changes)

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Watch ``prefix`` for changes with revision >= ``start_revision`` (<= 0: from now)."""
        local.check_prefix(prefix)
        state = self._live()
        with state.cond:
            return _MemoryWatch(state, prefix, local.resolve_start(start_revision, state.revision))

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds; return its id."""
        seconds = local.check_ttl(ttl)
        state = self._live()
        with state.cond:
            state.reap()
            lease_id = state.next_lease
            state.next_lease += 1
            state.leases[lease_id] = _Lease(seconds, state.clock() + seconds)
            # A waiting watch must learn about the new expiry time.
            state.cond.notify_all()
            return lease_id

    def refresh_lease(self, lease: int) -> None:
        """Extend ``lease`` by its TTL; raise ``LeaseLost`` if it is gone."""
        state = self._live()
        with state.cond:
            state.reap()
            held = state.leases.get(lease)
            if held is None:
                raise LeaseLost(f"lease {lease} has expired or was revoked")
            held.expires_at = state.clock() + held.ttl

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys. No error if already gone."""
        state = self._live()
        with state.cond:
            state.reap()
            if lease in state.leases:
                state.end_lease(lease)

    def close(self) -> None:
        """Detach this handle; the shared state lives on for other handles."""
        self._closed = True


def open_memory(url: str, *, create: bool = True) -> Store:
    """Open ``memory://NAME`` (state shared per NAME in this process) or ``memory://``.

    ``create`` is accepted for the common factory signature: a memory store
    always exists.
    """
    if not url.startswith(_SCHEME):
        raise StoreConfigError(
            f"not a memory store URL: {redact_url(url)!r} (expected memory://NAME)"
        )
    name = url[len(_SCHEME) :]
    if not name:
        return MemoryStore(url)
    with _NAMED_LOCK:
        state = _NAMED.get(name)
        if state is None:
            state = _NAMED[name] = _State(time.monotonic, local.DEFAULT_HISTORY)
    return MemoryStore(url, state=state)
