"""Writes to Consul's KV: one ``/v1/txn`` each, or ``PUT /v1/kv`` for a value too large.

Used by :class:`~allocator.store.consul.store.ConsulStore`. A transaction's
compares are ``check-index`` / ``check-not-exists`` operations beside its
writes, all or nothing; its results carry each written key's
``ModifyIndex``, so a write returns the exact revision it wrote at. A put
with a lease takes its key over from another lease's session (unlocking it
first, in the same transaction). A value whose transaction body would pass
Consul's 512 KiB request limit goes through ``PUT /v1/kv`` and its revision
is read back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from allocator.errors import CasConflict, ValueTooLarge
from allocator.store.base import Compare, KeyValue, Op, Put
from allocator.store.consul.connection import Client
from allocator.store.consul.payloads import (
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

__all__ = [
    "INDEX_PROBE",
    "MAX_TXN_OPS",
    "TXN_BODY_LIMIT",
    "TxnTooLarge",
    "put_large",
    "read_index",
    "read_key",
    "write",
]

#: Consul's limit on operations (checks and writes) in one /v1/txn.
MAX_TXN_OPS = 64
#: Consul's default txn_max_req_len: the largest /v1/txn body it accepts.
TXN_BODY_LIMIT = 512 * 1024
#: A key name nothing writes: reading it (absent) yields Consul's KV index.
INDEX_PROBE = ".allocator-index-probe"


class TxnTooLarge(Exception):
    """A transaction's body would pass :data:`TXN_BODY_LIMIT` (``size`` bytes)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def read_key(client: Client, key: str) -> KeyValue | None:
    """The current version of ``key`` (a consistent read), or ``None``."""
    name = consul_key(key)
    with client.call(f"read {key}"):
        _, item = client.kv.get(name, consistency="consistent")
    return key_value(item) if item else None


def write(client: Client, compares: Sequence[Compare], ops: Sequence[Op], what: str) -> int:
    """Send compares + ops as one /v1/txn; return the revision it wrote at.

    ``TxnTooLarge`` when the body would be larger than Consul accepts.
    """
    payload = [guard_op(c.key, c.mod_revision) for c in compares]
    payload += [write_op(op) for op in ops]
    keys = [c.key for c in compares] + [op.key for op in ops]
    try:
        results = _send_txn(client, payload, keys, what)
    except LockHeld as held:
        results = _send_txn(client, *_take_over(client, payload, keys, held.keys), what)
    indexes = [int(r["KV"]["ModifyIndex"]) for r in results if r.get("KV")]
    if any(isinstance(op, Put) for op in ops):
        return max(indexes)
    if ops:  # deletes only: no result carries the index
        return read_index(client, ops[0].key, what)
    with client.call(what):  # compares only: Consul ran them as a read
        index, _ = client.kv.get(INDEX_PROBE, consistency="consistent")
    return int(index)


def _send_txn(client: Client, payload: Payload, keys: Sequence[str], what: str) -> Any:
    body = json.dumps(payload)
    if len(body) > TXN_BODY_LIMIT:
        raise TxnTooLarge(len(body))
    if len(payload) > MAX_TXN_OPS:  # a takeover's unlocks can add operations
        raise ValueTooLarge(
            f"transaction needs {len(payload)} Consul operations; Consul accepts at most "
            f"{MAX_TXN_OPS}"
        )
    with client.call(what, write=True):
        code, reply = client.post_txn(body)
    if code == 200:
        return reply.get("Results") or []
    raise txn_failure(client.address, payload, keys, reply.get("Errors"))


def _take_over(
    client: Client, payload: Payload, keys: Sequence[str], held: Sequence[str]
) -> tuple[Payload, Sequence[str]]:
    """The payload again, unlocking ``held`` keys from their current sessions first."""
    holders = {}
    for key in held:
        found = read_key(client, key)
        if found is None or found.lease is None:
            raise CasConflict(f"{key} changed while moving it to another lease", keys=(key,))
        holders[key] = session_id(found.lease)
    return take_over(payload, keys, holders)


def read_index(client: Client, key: str, what: str) -> int:
    """Consul's index for ``key`` and the keys under it (one level of key names)."""
    with client.call(what):
        index, _ = client.kv.get(consul_key(key, "prefix"), keys=True, separator="/")
    return int(index)


def put_large(client: Client, key: str, value: bytes, expect: int | None, lease: int | None) -> int:
    """Write a value too big for a transaction body through ``PUT /v1/kv``."""
    if expect is not None and lease is not None:
        raise ValueTooLarge(
            f"value for {key} is {len(value)} bytes: Consul writes values this large only "
            "through /v1/kv, which cannot combine expect_revision with a lease"
        )
    flags = random_flags()
    with client.call(f"write {key}", write=True):
        done = client.put_value(key, value, cas=expect, flags=flags, lease=lease)
    if not done:
        raise CasConflict(f"compare failed: {key} changed or is held by another lease", keys=(key,))
    found = read_key(client, key)
    # The write's own index, unless a newer write to the key landed first.
    return found.mod_revision if found else read_index(client, key, f"write {key}")
