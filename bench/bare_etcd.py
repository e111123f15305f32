"""The floor for etcd rows: a bare client of etcd's JSON gateway on the standard library.

No failover, no budget, no error translation, no strict decoding: only what
any program needs to put, send a transaction and watch a prefix over
``http.client``. Baselines use it so a row compares allocator's etcd client
with the least a Python program could do over the same wire.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from typing import Any

__all__ = ["BareEtcd", "b64"]


def b64(data: bytes) -> str:
    """``data`` as the gateway writes bytes: base64 text."""
    return base64.b64encode(data).decode("ascii")


def _range_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


class BareEtcd:
    """One keep-alive connection for calls; each watch opens its own."""

    def __init__(self, endpoint: str, timeout: float = 10.0) -> None:
        self.host, port = endpoint.rsplit(":", 1)
        self.port = int(port)
        self.timeout = timeout
        self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path``; the decoded answer."""
        self._conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer = self._conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{path}: HTTP {answer.status}: {data[:200]!r}")
        reply: dict[str, Any] = json.loads(data)
        return reply

    def put(self, key: bytes, value: bytes) -> int:
        """Write ``key``; the revision."""
        reply = self.call("/v3/kv/put", {"key": b64(key), "value": b64(value)})
        return int(reply["header"]["revision"])

    def txn(self, request: dict[str, Any]) -> dict[str, Any]:
        """One transaction, as the gateway's JSON request."""
        return self.call("/v3/kv/txn", request)

    def watch(self, prefix: bytes) -> Iterator[list[dict[str, Any]]]:
        """The events of a prefix watch, a batch per message, once etcd has created it."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        body = {"create_request": {"key": b64(prefix), "range_end": b64(_range_end(prefix))}}
        conn.request("POST", "/v3/watch", json.dumps(body))
        answer = conn.getresponse()
        created = json.loads(answer.readline())
        if not created.get("result", {}).get("created"):
            raise RuntimeError(f"the watch was not created: {created}")
        return _batches(conn, answer)

    def close(self) -> None:
        """Close the call connection."""
        self._conn.close()


def _batches(conn: http.client.HTTPConnection, answer: Any) -> Iterator[list[dict[str, Any]]]:
    try:
        while line := answer.readline():
            if line.strip():
                yield json.loads(line).get("result", {}).get("events") or []
    finally:
        conn.close()
