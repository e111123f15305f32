"""etcd's v3 API in JSON (its gateway's encoding): building requests, reading replies.

The gateway speaks the gRPC messages in protobuf's JSON mapping: keys and
values are base64, 64-bit numbers are strings, and fields holding their
default (``0``, ``false``, an empty list) are left out of replies. Pure: no
I/O; :mod:`allocator.store.etcd.store` sends what this builds.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Sequence
from typing import Any

import msgspec

from allocator.errors import CasConflict
from allocator.store.base import (
    Compare,
    Event,
    KeyValue,
    Listing,
    Op,
    Put,
    Read,
    key_or_none,
    key_text,
)
from allocator.store.etcd.rules import conflict, prefix_range_end

__all__ = [
    "Json",
    "b64",
    "conflict_of",
    "etcd_object",
    "event_of",
    "json_object",
    "key_value_of",
    "listing_of",
    "listings_of",
    "range_listing",
    "range_request",
    "read_ops",
    "txn_request",
    "unb64",
    "watch_request",
]

Json = dict[str, Any]


def b64(data: bytes | str) -> str:
    """Base64 text of ``data`` (``str`` is encoded as UTF-8 first)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


def unb64(text: str | None) -> bytes:
    """The bytes of base64 ``text`` (absent: empty, as etcd leaves out an empty value)."""
    return binascii.a2b_base64(text) if text else b""


def _int(value: Any) -> int:
    return int(value) if value else 0


def key_value_of(kv: Json) -> KeyValue | None:
    """A :class:`KeyValue` from a reply's ``kv`` object; ``None`` if its key is not UTF-8."""
    key = key_or_none(unb64(kv.get("key")))
    if key is None:
        return None
    return KeyValue(
        key=key,
        value=unb64(kv.get("value")),
        mod_revision=_int(kv.get("mod_revision")),
        create_revision=_int(kv.get("create_revision")),
        lease=_int(kv.get("lease")) or None,
    )


def listing_of(kvs: Sequence[Json], revision: int) -> Listing:
    """The keys of a range response's ``kvs``; keys that are not UTF-8 in ``bad_keys``."""
    items: list[KeyValue] = []
    bad: list[str] = []
    for kv in kvs:
        item = key_value_of(kv)
        if item is None:
            bad.append(key_text(unb64(kv.get("key"))))
        else:
            items.append(item)
    return Listing(tuple(items), revision, tuple(bad))


def json_object(body: bytes) -> Json:
    """A reply's JSON object; ``ValueError`` for anything else."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{type(data).__name__}, not a JSON object")
    return data


def etcd_object(body: bytes) -> Json:
    """A reply's JSON object, if it is etcd's: its ``header`` names the cluster.

    ``ValueError`` for anything else (a ``{}`` from a proxy, an HTML page).
    """
    data = json_object(body)
    result = data.get("result")  # a streamed call's one answer (a lease keep-alive)
    header = (result if isinstance(result, dict) else data).get("header")
    if not isinstance(header, dict) or not header.get("cluster_id"):
        raise ValueError("not etcd's answer (no header.cluster_id)")
    return data


def event_of(item: Json) -> Event | None:
    """An :class:`Event` from a watch reply's event object (no ``type``: a put).

    ``None`` for a key that is not UTF-8: it names nothing a reader knows,
    and the next listing reports it.
    """
    kv = item.get("kv") or {}
    key = key_or_none(unb64(kv.get("key")))
    if key is None:
        return None
    revision = _int(kv.get("mod_revision"))
    if item.get("type", "PUT") == "DELETE":
        return Event("delete", key, None, revision)
    return Event("put", key, unb64(kv.get("value")), revision)


def range_request(
    key: str,
    *,
    prefix: bool = False,
    values: bool = True,
    limit: int | None = None,
    descending: bool = False,
    newest: bool = False,
) -> Json:
    """A range request for ``key`` (or every key under it, sorted by key, with ``prefix``).

    ``values`` ``False``: keys and revisions only; ``limit``: the first
    ``limit`` keys, in descending key order with ``descending``, or the
    ``limit`` written last with ``newest`` (sorted by modification revision).
    """
    raw = key.encode("utf-8")
    request: Json = {"key": b64(raw)}
    if prefix:
        order = "DESCEND" if descending or newest else "ASCEND"
        target = "MOD" if newest else "KEY"
        request.update(range_end=b64(prefix_range_end(raw)), sort_order=order, sort_target=target)
    if limit is not None:
        request["limit"] = str(limit)
    if not values:
        request["keys_only"] = True
    return request


def read_ops(reads: Sequence[Read]) -> list[Json]:
    """One range request op per read of a batch."""
    return [
        {
            "request_range": range_request(
                r.key,
                prefix=r.prefix,
                values=r.values,
                limit=r.limit,
                descending=r.descending,
                newest=r.newest,
            )
        }
        for r in reads
    ]


def listings_of(responses: Sequence[Json], revision: int) -> tuple[Listing, ...]:
    """The listings a transaction's range responses hold, all read at ``revision``."""
    return tuple(
        listing_of((r.get("response_range") or {}).get("kvs") or [], revision) for r in responses
    )


class _RangeKv(msgspec.Struct):
    key: bytes = b""  # base64 in the reply: msgspec decodes it as it parses
    value: bytes = b""
    mod_revision: int = 0  # a string in the reply ("strict=False" reads it)
    create_revision: int = 0
    lease: int = 0


class _RangeHeader(msgspec.Struct):
    revision: int = 0
    cluster_id: int = 0  # every etcd answer names its cluster


class _RangeReply(msgspec.Struct):
    header: _RangeHeader = msgspec.field(default_factory=_RangeHeader)
    kvs: list[_RangeKv] = msgspec.field(default_factory=list)


_RANGE_REPLY = msgspec.json.Decoder(_RangeReply, strict=False)


def range_listing(body: bytes) -> Listing:
    """The keys of a range reply's JSON text and the revision it was read at.

    One pass in C: a fleet's listing is 14,000 keys in 10 MB, where
    ``json.loads`` and then a base64 decode per key and value took longer
    than etcd took to answer. Raises ``ValueError`` for anything that is
    not a range reply.
    """
    try:
        reply = _RANGE_REPLY.decode(body)
    except msgspec.DecodeError as exc:  # also a ValidationError: a reply of another shape
        raise ValueError(f"not a range reply: {exc}") from None
    if not reply.header.cluster_id:
        raise ValueError("not etcd's range reply (no header.cluster_id)")
    kvs = reply.kvs
    try:  # every key text, as keys almost always are: one pass, no call per key
        keys = [kv.key.decode("utf-8") for kv in kvs]
    except UnicodeDecodeError:
        return _listing_with_bad_keys(kvs, reply.header.revision)
    items = tuple(
        KeyValue(key, kv.value, kv.mod_revision, kv.create_revision, kv.lease or None)
        for key, kv in zip(keys, kvs, strict=True)
    )
    return Listing(items, reply.header.revision)


def _listing_with_bad_keys(kvs: Sequence[_RangeKv], revision: int) -> Listing:
    """A range reply's keys where some are not text: those are named in ``bad_keys``."""
    items: list[KeyValue] = []
    bad: list[str] = []
    for kv in kvs:
        key = key_or_none(kv.key)
        if key is None:
            bad.append(key_text(kv.key))
            continue
        items.append(KeyValue(key, kv.value, kv.mod_revision, kv.create_revision, kv.lease or None))
    return Listing(tuple(items), revision, tuple(bad))


def watch_request(prefix: str, start_revision: int) -> Json:
    """A watch create request for every key under ``prefix`` from ``start_revision``."""
    raw = prefix.encode("utf-8")
    return {
        "create_request": {
            "key": b64(raw),
            "range_end": b64(prefix_range_end(raw)),
            "start_revision": str(max(start_revision, 0)),
        }
    }


def _compare(compare: Compare) -> Json:
    if compare.mod_revision == 0:  # must not exist
        return {"key": b64(compare.key), "target": "CREATE", "result": "EQUAL"}
    return {
        "key": b64(compare.key),
        "target": "MOD",
        "result": "EQUAL",
        "mod_revision": str(compare.mod_revision),
    }


def _request_op(op: Op) -> Json:
    if isinstance(op, Put):
        put: Json = {"key": b64(op.key), "value": b64(op.value)}
        if op.lease:
            put["lease"] = str(op.lease)
        return {"request_put": put}
    doomed: Json = {"key": b64(op.key)}
    if op.prefix:
        doomed["range_end"] = b64(prefix_range_end(op.key.encode()))
    return {"request_delete_range": doomed}


def txn_request(compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read] = ()) -> Json:
    """A transaction: ``ops`` if every compare holds, else a read of every compared key.

    The failure branch lets a conflict name the keys that changed as of the
    very revision the compare failed at; ``reads`` follow those reads there.
    """
    return {
        "compare": [_compare(c) for c in compares],
        "success": [_request_op(op) for op in ops],
        "failure": [{"request_range": {"key": b64(c.key), "keys_only": True}} for c in compares]
        + read_ops(reads),
    }


def conflict_of(compares: Sequence[Compare], reply: Json) -> CasConflict:
    """The ``CasConflict`` a failed transaction's reply describes."""
    found = []
    for response in (reply.get("responses") or [])[: len(compares)]:
        kvs = (response.get("response_range") or {}).get("kvs") or []
        found.append(_int(kvs[0].get("mod_revision")) if kvs else 0)
    found += [0] * (len(compares) - len(found))
    return conflict(compares, found)
