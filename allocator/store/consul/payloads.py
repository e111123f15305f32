"""The pure parts of the Consul backend: key mapping, transaction payloads, watches.

Nothing here does I/O or imports py-consul: :mod:`allocator.store.consul.store`
and :mod:`allocator.store.consul.writes` send what these functions build, and
the store hands :class:`ConsulWatch` a function that runs one (blocking)
query, so the watch loop's decisions -- diffing snapshots, resetting an
index that went backwards, rate-limiting -- are tested on plain data with an
injected clock.
"""

from __future__ import annotations

import base64
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from allocator.errors import CasConflict, Compacted, InvalidInput, LeaseLost, PermissionDenied
from allocator.store import local
from allocator.store.base import Delete, Event, KeyValue, Op

__all__ = [
    "Baselines",
    "ConsulWatch",
    "Item",
    "LockHeld",
    "Payload",
    "Query",
    "TokenBucket",
    "consul_key",
    "diff_snapshot",
    "guard_op",
    "key_value",
    "random_flags",
    "refusal_text",
    "session_id",
    "take_over",
    "txn_failure",
    "write_op",
]

#: One KV entry as py-consul returns it (``Value`` already base64-decoded).
Item = Mapping[str, Any]
#: A /v1/txn request body.
Payload = list[dict[str, Any]]
#: ``query(index, wait)`` reads the watched prefix: (X-Consul-Index, entries).
#: ``index`` 0 answers at once; otherwise it blocks up to ``wait`` seconds.
Query = Callable[[int, float], tuple[int, list[Item]]]

#: Under churn a watch degrades to one query per interval (after a burst of 2).
WATCH_MIN_INTERVAL_S = 1.0


def consul_key(key: str, what: str = "key") -> str:
    """The Consul key for a Store key: ``/a/b`` -> ``a/b`` (a prefix may map to ``""``)."""
    local.check_key(key, what)
    inner = key[1:]
    if inner.startswith("/") or (what == "key" and not inner):
        raise InvalidInput(
            f"store {what} {key!r} cannot be stored in Consul: '/' must start a name"
        )
    return inner


def key_value(item: Item) -> KeyValue:
    """A Store ``KeyValue`` from a Consul KV entry; a lock holder becomes the lease."""
    session = item.get("Session")
    return KeyValue(
        key="/" + str(item["Key"]),
        value=item.get("Value") or b"",
        mod_revision=int(item["ModifyIndex"]),
        create_revision=int(item["CreateIndex"]),
        lease=uuid.UUID(str(session)).int if session else None,
    )


def session_id(lease: int) -> str:
    """The Consul session a lease id stands for (a lease id is the session UUID's int)."""
    try:
        return str(uuid.UUID(int=lease))
    except (ValueError, TypeError) as exc:
        raise LeaseLost(f"lease {lease!r} is not a Consul session") from exc


def random_flags() -> int:
    """Flags for a write: Consul skips a write that changes nothing, keeping the old
    ModifyIndex; a random value makes every write a real one with a new index."""
    return random.getrandbits(63) | 1


def _kv_op(verb: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"KV": {"Verb": verb, "Key": key, **fields}}


def guard_op(key: str, mod_revision: int) -> dict[str, Any]:
    """The txn operation that checks a compare (0 = the key must not exist)."""
    if mod_revision == 0:
        return _kv_op("check-not-exists", consul_key(key))
    return _kv_op("check-index", consul_key(key), Index=mod_revision)


def write_op(op: Op) -> dict[str, Any]:
    """The txn operation for a put (``lock`` when leased) or a delete."""
    key = consul_key(op.key)
    if isinstance(op, Delete):
        return _kv_op("delete-tree" if op.prefix else "delete", key)
    value = base64.b64encode(op.value).decode("ascii")
    lease = local.lease_of(op.lease)
    if lease is None:
        return _kv_op("set", key, Value=value, Flags=random_flags())
    return _kv_op("lock", key, Value=value, Flags=random_flags(), Session=session_id(lease))


def take_over(
    payload: Payload, keys: Sequence[str], holders: Mapping[str, str]
) -> tuple[Payload, list[str]]:
    """``payload`` with each ``lock`` of a key in ``holders`` preceded by an ``unlock``
    by its current holder: etcd lets a put move a key to another lease, Consul only
    lets the holding session let go. Returns the new payload and its Store keys."""
    new_payload: Payload = []
    new_keys: list[str] = []
    for op, key in zip(payload, keys, strict=True):
        if op["KV"]["Verb"] == "lock" and key in holders:
            new_payload.append(_kv_op("unlock", consul_key(key), Session=holders[key]))
            new_keys.append(key)
        new_payload.append(op)
        new_keys.append(key)
    return new_payload, new_keys


class LockHeld(Exception):
    """A ``lock`` failed because another session holds these (Store) keys."""

    def __init__(self, keys: Sequence[str]) -> None:
        super().__init__(", ".join(keys))
        self.keys = tuple(keys)


def refusal_text(verb: str, key: str, what: str) -> str:
    """``txn set KEY (Permission denied): grant ...``: the operation, the key, what to grant."""
    need = "read" if verb in ("get", "get-tree", "check-index", "check-session") else "write"
    if "ACL not found" in what:
        return f"txn {verb} {key} ({what}): the token is unknown to Consul"
    return (
        f"txn {verb} {key} ({what}): grant the token's ACL policy "
        f'key "{key.lstrip("/")}" {{ policy = "{need}" }}'
    )


def txn_failure(
    address: str, payload: Sequence[Mapping[str, Any]], keys: Sequence[str], errors: Any
) -> Exception:
    """The exception for a transaction Consul rolled back (409), from its ``Errors``.

    ``keys[i]`` is the Store key of ``payload[i]``; each error's ``OpIndex``
    points into both.
    """
    failed = []
    for error in errors or ():
        at = int(error["OpIndex"])
        failed.append((str(payload[at]["KV"]["Verb"]), keys[at], str(error["What"])))
    whats = "; ".join(f"{key}: {what}" for _, key, what in failed)
    refused = [f for f in failed if "Permission denied" in f[2] or "ACL not found" in f[2]]
    if refused:
        return PermissionDenied(f"Consul at {address} refused {refusal_text(*refused[0])}")
    locks = [(key, what) for verb, key, what in failed if verb == "lock"]
    if any("session" in what and "held" not in what for _, what in locks):
        return LeaseLost(f"cannot write with a lease that expired or was revoked: {whats}")
    if any("held" in what for _, what in locks):
        return LockHeld([key for key, what in locks if "held" in what])
    conflicted = tuple(dict.fromkeys(key for _, key, _ in failed))
    return CasConflict(f"compare failed: {whats}", keys=conflicted)


class TokenBucket:
    """A token bucket (``burst`` tokens, one more per ``interval``) on an injected clock."""

    def __init__(self, interval: float, burst: float, now: float) -> None:
        self.interval = interval
        self.burst = burst
        self.tokens = burst
        self._stamp = now

    def _refill(self, now: float) -> None:
        if self.interval <= 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self._stamp) / self.interval)
        self._stamp = now

    def delay(self, now: float) -> float:
        """Seconds until a token is available (0 when one is)."""
        self._refill(now)
        return max(0.0, (1 - self.tokens) * self.interval)

    def take(self, now: float) -> None:
        """Spend one token."""
        self._refill(now)
        self.tokens -= 1


def diff_snapshot(
    known: Mapping[str, int], items: Sequence[Item], index: int, start: int
) -> tuple[list[Event], dict[str, int]]:
    """The events that turn ``known`` (Consul key -> ModifyIndex) into ``items``.

    Puts carry their ``ModifyIndex``; deletes carry the response ``index``
    (Consul does not say when a key went). Only revisions >= ``start`` are
    reported; the new ``known`` map is returned with them.
    """
    current = {str(item["Key"]): item for item in items}
    seen = {key: int(item["ModifyIndex"]) for key, item in current.items()}
    puts = [
        Event("put", "/" + key, current[key].get("Value") or b"", revision)
        for key, revision in seen.items()
        if known.get(key) != revision and revision >= start
    ]
    puts.sort(key=lambda event: (event.revision, event.key))
    gone = sorted(key for key in known if key not in current) if index >= start else []
    return puts + [Event("delete", "/" + key, None, index) for key in gone], seen


class Baselines:
    """What each prefix held over a range of revisions: the starting point of a watch.

    Consul keeps no history, so a watch from revision ``s`` can only tell
    which keys were deleted since ``s - 1`` by comparing with what the
    prefix held at ``s - 1``. ``list`` records each listing here (state held
    at its revision) and every watch records what it has seen (state held
    from its last change to its last index), so the usual "list, then watch
    from revision + 1" and "resume after the last event" find one. Shared by
    the store handles of one process (the agent lists on one handle and
    watches on others); bounded, thread-safe.
    """

    def __init__(self, prefixes: int = 64, per_prefix: int = 4) -> None:
        self._prefixes = prefixes
        self._per_prefix = per_prefix
        self._ranges: OrderedDict[str, list[tuple[int, int, dict[str, int]]]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, prefix: str, low: int, high: int, known: Mapping[str, int]) -> None:
        """Remember that ``prefix`` held ``known`` (key -> ModifyIndex) at revisions low..high."""
        with self._lock:
            ranges = self._ranges.pop(prefix, [])
            ranges = [r for r in ranges if (r[0], r[1]) != (low, high)]
            ranges.append((low, high, dict(known)))
            self._ranges[prefix] = ranges[-self._per_prefix :]
            while len(self._ranges) > self._prefixes:
                self._ranges.popitem(last=False)

    def find(self, prefix: str, revision: int) -> dict[str, int] | None:
        """What ``prefix`` held at ``revision``, if recorded."""
        with self._lock:
            for low, high, known in reversed(self._ranges.get(prefix, [])):
                if low <= revision <= high:
                    return dict(known)
        return None

    def forget(self, prefix: str) -> None:
        """Drop what was recorded for ``prefix`` (its indexes went backwards)."""
        with self._lock:
            self._ranges.pop(prefix, None)


class ConsulWatch:
    """A prefix watch on Consul blocking queries (``?recurse&index=&wait=``).

    Creating it reads the prefix once. If nothing under the prefix changed
    since the start revision, there is nothing to replay. Otherwise Consul,
    which keeps no history, can only say what was deleted by comparing with
    what the prefix held at ``start - 1``: with that baseline (from
    ``baselines``: a listing at that revision, or an earlier watch) the read
    is diffed against it, and changed keys arrive as puts, vanished ones as
    deletes; without one, a delete may have been lost, so ``next`` raises
    :class:`Compacted` and the caller re-reads and watches from there. After
    that each response is diffed with the previous one: new or changed keys
    become puts, vanished keys deletes; versions overwritten between two
    responses are not seen. An index that goes backwards (a snapshot restore, say)
    resets the query to index 0, as Consul's docs require, and from then on
    every change is delivered whatever its revision. Answers that come early
    without a newer index spend tokens of a bucket (burst 2, one per
    ``min_interval``), so a server answering at once cannot drive a busy
    loop, while changes that do advance the index are never held back.
    """

    def __init__(
        self,
        query: Query,
        prefix: str,
        start_revision: int,
        *,
        on_close: Callable[[], None] = lambda: None,
        min_interval: float = WATCH_MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        baselines: Baselines | None = None,
    ) -> None:
        self._query = query
        self._prefix = prefix
        self._on_close = on_close
        self._clock = clock
        self._sleep = sleep
        self._bucket = TokenBucket(min_interval, 2, clock())
        self._baselines = baselines or Baselines()
        self._closed = False
        index, items = query(0, 0.0)
        self._start = start_revision if start_revision > 0 else index + 1
        baseline = None
        if self._start <= index:  # something under the prefix changed since start - 1
            baseline = self._baselines.find(prefix, self._start - 1)
        self._lost = self._start <= index and baseline is None
        self._pending, self._known = diff_snapshot(baseline or {}, items, index, self._start)
        self._unchanged_since = self._start - 1 if baseline is not None else index
        self._index = max(index, 1)  # never 0: a query at index 0 does not block
        self._remember(self._pending, index)

    def next(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds; return the next batch of events."""
        if self._closed:
            return []
        if self._lost:
            self._lost = False
            raise Compacted(
                f"Consul cannot replay deletes under {self._prefix} from revision "
                f"{self._start}; re-read and watch again",
                compact_revision=self._index,
            )
        if self._pending:
            events, self._pending = self._pending, []
            return events
        deadline = self._clock() + max(timeout, 0.0)
        while not self._closed:
            delay = self._bucket.delay(self._clock())
            if delay >= deadline - self._clock():
                self._sleep(max(0.0, deadline - self._clock()))
                return []
            if delay > 0:
                self._sleep(delay)
            try:
                events = self._poll(max(deadline - self._clock(), 0.001))
            except Exception:
                if self._closed:  # close() from another thread cut the query short
                    return []
                raise
            if events or self._clock() >= deadline:
                return events
        return []

    def _poll(self, wait: float) -> list[Event]:
        asked = self._clock()
        index, items = self._query(self._index, wait)
        answered = self._clock()
        # Only an answer that came early without a newer index is suspect; one that
        # waited (most of) its wait out is what a quiet prefix looks like.
        if index <= self._index and answered - asked < wait * 0.9:
            self._bucket.take(answered)
        if 0 < index < self._index:
            # Consul's rule: an index that goes backwards restarts the loop at 0. The
            # store's indexes restarted (or shrank), so every change from here on is new.
            self._index, self._start = 0, 0
            self._baselines.forget(self._prefix)
            self._unchanged_since = index
        else:
            self._index = max(index, 1)  # 0 is a server bug; blocking at 1 is always safe
        events, self._known = diff_snapshot(self._known, items, index, self._start)
        self._remember(events, index)
        return events

    def _remember(self, events: Sequence[Event], index: int) -> None:
        """Record what the prefix holds, and since when it has held it, for later watches."""
        if events:
            self._unchanged_since = max(e.revision for e in events)
        low = min(self._unchanged_since, index)
        self._baselines.record(self._prefix, low, max(index, low), self._known)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Stop watching and release the watch's connection. Idempotent."""
        if not self._closed:
            self._closed = True
            self._on_close()
