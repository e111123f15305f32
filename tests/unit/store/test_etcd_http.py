"""etcd's JSON gateway client: what only an HTTP client can get wrong.

The shared semantics are in tests/contract and the etcd behaviour (outages,
auth, TLS, failover, ambiguous writes) in test_etcd_store.py and
test_etcd_security.py. Here: servers that are not etcd, connections the
server closed while idle, and the pure rules that read etcd's answers.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from allocator.errors import (
    AmbiguousWrite,
    CasConflict,
    Compacted,
    LeaseLost,
    PermissionDenied,
    StoreConfigError,
    StoreUnavailable,
    ValueTooLarge,
)
from allocator.store import Compare, Event, open_store
from allocator.store.etcd.json_api import (
    conflict_of,
    event_of,
    key_value_of,
    range_listing,
    txn_request,
)
from allocator.store.etcd.rules import (
    Code,
    maybe_applied,
    prefix_range_end,
    translate_status,
    watch_error,
    worth_another_endpoint,
)
from tests.support.etcd_server import EtcdServer

Handler = Callable[[socket.socket, int], None]


class FakeServer:
    """A loopback listener whose ``handle(connection, index)`` answers each connection."""

    def __init__(self, handle: Handler) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._handle = handle
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self._listener.getsockname()[1]}?timeout=3"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            index = self.connections
            threading.Thread(target=self._answer, args=(conn, index), daemon=True).start()

    def _answer(self, conn: socket.socket, index: int) -> None:
        with conn, suppress(OSError):
            self._handle(conn, index)

    def close(self) -> None:
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], FakeServer]]:
    servers: list[FakeServer] = []

    def start(handle: Handler) -> FakeServer:
        servers.append(FakeServer(handle))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request's head and body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


def json_answer(payload: object) -> bytes:
    body = json.dumps(payload).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def test_a_server_that_does_not_speak_http_is_unavailable_and_named(
    serve: Callable[[Handler], FakeServer],
) -> None:
    def ssh(conn: socket.socket, index: int) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        read_request(conn)

    server = serve(ssh)
    store = open_store(server.url)
    try:
        with pytest.raises(StoreUnavailable, match=r"not HTTP.*is it an etcd v3 server"):
            store.get("/k")
    finally:
        store.close()


def test_an_http_server_that_is_not_etcd_is_unavailable_saying_so(
    serve: Callable[[Handler], FakeServer],
) -> None:
    def web(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nNot Found")

    store = open_store(serve(web).url)
    try:
        with pytest.raises(StoreUnavailable, match=r"HTTP 404 .*JSON gateway"):
            store.put("/k", b"v")
    finally:
        store.close()


def test_a_connection_the_server_closed_while_idle_is_reopened_not_ambiguous(
    serve: Callable[[Handler], FakeServer],
) -> None:
    # Keep-alive connections may be closed by the server (or a proxy) while
    # idle; a write must go out on a fresh one, not be reported as "may have
    # been applied" because the old one was found dead after sending.
    closed = threading.Event()

    def one_answer_per_connection(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(json_answer({"header": {"cluster_id": "7", "revision": str(index)}}))
        conn.close()  # without saying "Connection: close"
        closed.set()

    server = serve(one_answer_per_connection)
    store = open_store(server.url)
    try:
        assert store.get("/k") is None  # etcd answered: the writes need no check first
        assert closed.wait(10)  # idle, and closed by the server
        closed.clear()
        assert store.put("/k", b"1") == 2
        assert closed.wait(10)
        assert store.put("/k", b"2") == 3
        assert server.connections == 3
    finally:
        store.close()


def test_a_write_whose_answer_never_comes_may_have_been_applied(
    serve: Callable[[Handler], FakeServer],
) -> None:
    def swallow(conn: socket.socket, index: int) -> None:
        if index == 1:  # the check that etcd answers here
            read_request(conn)
            conn.sendall(json_answer({"header": {"cluster_id": "7", "revision": "1"}}))
        read_request(conn)
        conn.recv(1)  # hold the connection open, never answer

    store = open_store(serve(swallow).url.replace("timeout=3", "timeout=0.5"))
    try:
        with pytest.raises(AmbiguousWrite, match="may have been applied"):
            store.put("/k", b"v")
        with pytest.raises(StoreUnavailable) as read:
            store.get("/k")
        assert not isinstance(read.value, AmbiguousWrite)
    finally:
        store.close()


# --- the rules that read etcd's answers ----------------------------------------------


@pytest.mark.parametrize(
    ("code", "details", "kind"),
    [
        (Code.UNAVAILABLE, "etcdserver: no leader", StoreUnavailable),
        (Code.DEADLINE_EXCEEDED, "context deadline exceeded", StoreUnavailable),
        (Code.INVALID_ARGUMENT, "etcdserver: user name is empty", PermissionDenied),
        (Code.PERMISSION_DENIED, "etcdserver: permission denied", PermissionDenied),
        (Code.INVALID_ARGUMENT, "etcdserver: authentication failed", PermissionDenied),
        (Code.FAILED_PRECONDITION, "etcdserver: authentication is not enabled", StoreConfigError),
        (Code.NOT_FOUND, "etcdserver: requested lease not found", LeaseLost),
        (Code.INVALID_ARGUMENT, "etcdserver: request is too large", ValueTooLarge),
        (Code.UNIMPLEMENTED, "unknown service", StoreUnavailable),
    ],
)
def test_etcd_answers_map_onto_allocator_errors(code: int, details: str, kind: type) -> None:
    error = translate_status(code, details, "h:2379")
    assert type(error) is kind and "h:2379" in str(error)


def test_only_writes_etcd_may_have_taken_are_ambiguous() -> None:
    assert maybe_applied(Code.UNAVAILABLE, "etcdserver: request timed out")
    assert maybe_applied(Code.DEADLINE_EXCEEDED, "")
    assert not maybe_applied(Code.UNAVAILABLE, "etcdserver: no leader")
    assert not maybe_applied(Code.UNAVAILABLE, "failed to connect to all addresses")
    assert not maybe_applied(Code.PERMISSION_DENIED, "etcdserver: permission denied")


def test_a_write_moves_to_another_endpoint_only_if_it_cannot_have_been_applied() -> None:
    assert worth_another_endpoint(Code.UNAVAILABLE, "etcdserver: request timed out", True)
    assert not worth_another_endpoint(Code.UNAVAILABLE, "etcdserver: request timed out", False)
    assert worth_another_endpoint(Code.UNAVAILABLE, "etcdserver: no leader", False)
    assert not worth_another_endpoint(Code.PERMISSION_DENIED, "denied", True)


@pytest.mark.parametrize(
    ("prefix", "end"),
    [(b"/a/", b"/a0"), (b"a\xff", b"b"), (b"\xff\xff", b"\0"), (b"/x\xff\xff", b"/y")],
)
def test_a_prefix_range_ends_after_its_last_key(prefix: bytes, end: bytes) -> None:
    assert prefix_range_end(prefix) == end


def test_watch_replies_say_compacted_and_refused() -> None:
    compacted = watch_error(7, True, "", "h:1")
    assert isinstance(compacted, Compacted) and compacted.compact_revision == 7
    assert isinstance(watch_error(0, True, "etcdserver: permission denied", "h"), PermissionDenied)
    assert isinstance(watch_error(0, True, "", "h"), StoreUnavailable)
    assert watch_error(0, False, "", "h") is None


def test_json_replies_leave_out_defaults_and_are_read_as_such() -> None:
    kv = key_value_of({"key": "L2s=", "mod_revision": "5", "create_revision": "4"})
    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision, kv.lease) == (
        "/k",
        b"",
        5,
        4,
        None,
    )
    deleted = event_of({"type": "DELETE", "kv": {"key": "L2s=", "mod_revision": "6"}})
    assert (deleted.type, deleted.key, deleted.value, deleted.revision) == ("delete", "/k", None, 6)
    put = event_of({"kv": {"key": "L2s=", "value": "dg==", "mod_revision": "7"}})
    assert (put.type, put.value) == ("put", b"v")


def test_a_range_reply_is_read_in_one_pass_as_each_key_value_would_be() -> None:
    kvs = [
        {"key": "L2E=", "value": "eyJ4IjoxfQ==", "mod_revision": "9", "create_revision": "3"},
        {"key": "L2I=", "mod_revision": "5", "create_revision": "5", "lease": "7587869137"},
        {"key": "L2M=", "value": "dg==", "mod_revision": 12, "create_revision": 2, "lease": 7},
        {"key": "L2Q=", "value": "", "version": "1", "unknown_field": [1, 2]},
    ]
    body = {"header": {"cluster_id": "7", "revision": "41"}, "kvs": kvs, "count": "4"}
    listing = range_listing(json.dumps(body).encode())
    assert listing.revision == 41
    assert listing.items == tuple(key_value_of(kv) for kv in kvs)
    assert [(kv.key, kv.value, kv.lease) for kv in listing.items] == [
        ("/a", b'{"x":1}', None),
        ("/b", b"", 7587869137),
        ("/c", b"v", 7),
        ("/d", b"", None),
    ]


def test_a_range_reply_with_a_key_that_is_no_text_names_it_and_keeps_the_rest() -> None:
    kvs = [
        {"key": "L2E=", "value": "dg==", "mod_revision": "9", "create_revision": "3"},
        {"key": "L/8=", "value": "dg==", "mod_revision": "9", "create_revision": "3"},  # b"/\xff"
        {"key": "L2M=", "value": "dw==", "mod_revision": "4", "create_revision": "4"},
    ]
    body = {"header": {"cluster_id": "7", "revision": "41"}, "kvs": kvs}
    listing = range_listing(json.dumps(body).encode())
    assert [(kv.key, kv.value) for kv in listing.items] == [("/a", b"v"), ("/c", b"w")]
    assert (listing.bad_keys, listing.revision) == (("/\\xff",), 41)


def test_an_empty_range_reply_leaves_out_its_kvs_and_is_read_as_none() -> None:
    listing = range_listing(b'{"header": {"cluster_id": "7", "revision": "8"}}')
    assert (listing.items, listing.revision) == ((), 8)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>busy</html>", "not a range reply"),
        (b"[1, 2]", "not a range reply"),
        (b'{"kvs": [{"key": "not base64!"}]}', "not a range reply"),
        (b'{"kvs": [{"key": "L2E=", "mod_revision": "soon"}]}', "not a range reply"),
    ],
)
def test_a_reply_that_is_no_range_reply_is_a_value_error(body: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        range_listing(body)


def test_a_server_whose_range_answer_is_not_etcds_is_unavailable_saying_so(
    serve: Callable[[Handler], FakeServer],
) -> None:
    def odd(conn: socket.socket, index: int) -> None:
        while read_request(conn):
            conn.sendall(json_answer({"kvs": "everything"}))

    store = open_store(serve(odd).url)
    try:
        with pytest.raises(StoreUnavailable, match=r"not a range reply.*etcd v3 server"):
            store.list("/a/")
    finally:
        store.close()


def test_a_failed_json_transaction_names_the_keys_that_changed() -> None:
    compares = [Compare("/a", 3), Compare("/b", 0), Compare("/c", 9)]
    request = txn_request(compares, [])
    assert [c["target"] for c in request["compare"]] == ["MOD", "CREATE", "MOD"]
    reply = {
        "responses": [
            {"response_range": {"kvs": [{"mod_revision": "3"}]}},
            {"response_range": {"kvs": [{"mod_revision": "5"}]}},
            {"response_range": {}},
        ]
    }
    error = conflict_of(compares, reply)
    assert isinstance(error, CasConflict) and error.keys == ("/b", "/c")


def test_an_etcd_without_its_json_gateway_is_unavailable_saying_so(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "etcd", extra_args=["--enable-grpc-gateway=false"])
    server.start()
    try:
        store = open_store(server.url)
        try:
            with pytest.raises(StoreUnavailable, match="JSON gateway"):
                store.get("/k")
        finally:
            store.close()
    finally:
        server.stop()


# --- failover past an endpoint that is not etcd ----------------------------------------

_HTML = b"<html><body>It works!</body></html>"
NOT_ETCD = {
    "html page": b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_HTML), _HTML),
    "proxy 502": b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n\r\n%s" % (len(_HTML), _HTML),
    "ssh banner": b"SSH-2.0-OpenSSH_9.2\r\n",
    "http/1.0 read to close": b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
    "100 continue": b"HTTP/1.1 100 Continue\r\n\r\n"
    + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    "empty json": json_answer({}),
}


@pytest.mark.parametrize("answer", NOT_ETCD.values(), ids=NOT_ETCD.keys())
def test_reads_and_writes_move_past_an_endpoint_that_is_not_etcd(
    serve: Callable[[Handler], FakeServer], etcd_server: EtcdServer, answer: bytes
) -> None:
    def impostor(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(answer)

    fake = serve(impostor).url.removeprefix("etcd://").split("?")[0]
    key = f"/failover-{uuid.uuid4().hex}"
    for calls in (["put", "get"], ["get", "put"], ["list"]):
        store = open_store(f"etcd://{fake},{etcd_server.endpoint}?timeout=5")
        try:
            for call in calls:
                if call == "put":
                    assert store.put(key, b"v") > 0
                elif call == "get":
                    found = store.get(key)
                    assert found is None or found.value == b"v"
                else:
                    assert [kv.key for kv in store.list(key).items] == [key]
        finally:
            store.close()


def test_a_watch_moves_past_an_endpoint_whose_stream_is_not_etcds(
    serve: Callable[[Handler], FakeServer], etcd_server: EtcdServer
) -> None:
    def impostor(conn: socket.socket, index: int) -> None:
        read_request(conn)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"result":{}}\n')

    fake = serve(impostor).url.removeprefix("etcd://").split("?")[0]
    key = f"/watched-{uuid.uuid4().hex}"
    store = open_store(f"etcd://{fake},{etcd_server.endpoint}?timeout=5")
    try:
        watch = store.watch(key, 0)
        try:
            store.put(key, b"v")
            deadline = time.monotonic() + 10
            events: list[Event] = []
            while not events and time.monotonic() < deadline:
                events = watch.next(0.5)
            assert [(e.key, e.value) for e in events] == [(key, b"v")]
        finally:
            watch.close()
    finally:
        store.close()
