"""``allocator serve`` stays fair: bounded history reads, per-client limits, real queue counts.

A real server over a real etcd (or SQLite): one client holding many event
streams must not shut others out; a history request reads a page, not all
of history; a queue key that is not a request is not counted as one.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.placement.request import Request
from allocator.records.keys import KeyLayout
from allocator.store import open_store
from tests.e2e.serve_harness import Served
from tests.support.raw_store import put_raw_key

#: What one history request returns without ``limit`` (docs/operations.md).
DEFAULT_LIMIT = 100
#: Connections serve takes at once in the stream test (small: the test opens them all).
MAX_CONNECTIONS = 48


@pytest.fixture
def on_etcd(prefix: str, tmp_path: Path, etcd_server: Any) -> Iterator[Served]:
    served = Served(
        str(etcd_server.url), prefix, tmp_path, "--max-connections", str(MAX_CONNECTIONS)
    )
    try:
        yield served
    finally:
        served.close()


def _stream(port: int, source: str) -> tuple[socket.socket, bytes]:
    """An open ``/api/v1/events`` stream from ``source``, its response head read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(256)
        if not chunk:
            break
        head += chunk
    return sock, head


def _get_from(port: int, source: str, path: str) -> int:
    """The HTTP status of ``GET path`` sent from the address ``source``."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64)
    return int(head.split()[1]) if head.startswith(b"HTTP/") else 0


def test_one_client_s_event_streams_do_not_shut_out_other_clients(on_etcd: Served) -> None:
    streams = []
    try:
        for _ in range(MAX_CONNECTIONS):
            streams.append(_stream(on_etcd.port, "127.0.0.1"))
        # Another machine (another loopback address) is still answered, /metrics included.
        assert _get_from(on_etcd.port, "127.0.0.2", "/metrics") == 200
        assert _get_from(on_etcd.port, "127.0.0.2", "/api/v1/summary") == 200
        heads = [head.split(b"\r\n")[0] for _sock, head in streams]
        served = [head for head in heads if b" 200 " in head]
        assert served and all(b" 429 " in head for head in heads[len(served) :])
    finally:
        for sock, _head in streams:
            sock.close()


def test_history_reads_a_page_by_default_and_limit_zero_is_invalid(on_etcd: Served) -> None:
    store = open_store(on_etcd.env["ALLOCATOR_STORE"])
    try:
        allocator = Allocator(store, prefix=on_etcd.env["ALLOCATOR_PREFIX"])
        for n in range(DEFAULT_LIMIT // 2 + 1):  # a set and a release each
            allocator.assign(Request(job=f"j{n}", host="node1", gpus=(0,)))
            allocator.release("node1", f"j{n}")
    finally:
        store.close()
    code, body, _ = on_etcd.get("/api/v1/history")
    assert code == 200 and len(json.loads(body)["entries"]) == DEFAULT_LIMIT
    code, body, _ = on_etcd.get("/api/v1/history?limit=0")
    assert code == 400 and json.loads(body)["exit_code"] == 2
    code, body, _ = on_etcd.get("/api/v1/history?limit=1000000")
    assert code == 400 and json.loads(body)["exit_code"] == 2


def test_a_queue_key_that_is_not_a_request_is_not_counted_as_queued(on_etcd: Served) -> None:
    layout = KeyLayout(on_etcd.env["ALLOCATOR_PREFIX"])
    put_raw_key(on_etcd.env["ALLOCATOR_STORE"], layout.queue_entry("node1", "junk").encode(), b"{")
    assert on_etcd.cli("set", "job=train", "gpus=1", "host=node1").code == 0  # a change after it

    def summary() -> dict[str, Any] | None:
        code, body, _ = on_etcd.get("/api/v1/summary")
        document: dict[str, Any] = json.loads(body)
        return document if code == 200 and document["total"]["held"] == 1 else None

    assert on_etcd.wait_until("the set to be seen", summary)["total"]["queued"] == 0
    result = on_etcd.cli("status", "--summary", "-o", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["total"]["queued"] == 0


def test_usage_queries_share_one_read_of_history(
    prefix: str, tmp_path: Path, etcd_server_private: Any
) -> None:
    served = Served(str(etcd_server_private.url), prefix, tmp_path)
    try:
        assert served.cli("set", "job=train", "gpus=0", "host=node1").code == 0
        before = etcd_server_private.requests_served("Range")
        assert served.get("/api/v1/usage?since=7d")[0] == 200
        one_read = etcd_server_private.requests_served("Range") - before
        before = etcd_server_private.requests_served("Range")
        for query in ("since=6d", "since=5d&by=job", "since=4d&by=host", "by=team&limit=3"):
            code, body, _ = served.get(f"/api/v1/usage?{query}")
            assert code == 200 and json.loads(body)["rows"], query
        # Other windows and groupings are answered from the same read, not a read each.
        assert etcd_server_private.requests_served("Range") - before < one_read
    finally:
        served.close()
