"""The HTTP layer of the etcd client: h11 parses, our sockets time and fail precisely."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress

import pytest

from allocator.store.etcd.http_wire import HttpConnection, NoAnswer, NotHttp

Answer = Callable[[socket.socket], None]
JOIN_S = 10.0  # a hang guard, not a timing


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def answering() -> Iterator[Callable[[Answer], HttpConnection]]:
    """A connection to a loopback server that reads one request head and runs ``answer``."""
    listeners: list[socket.socket] = []
    connections: list[HttpConnection] = []

    def start(answer: Answer) -> HttpConnection:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            with suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    _read_head(conn)
                    answer(conn)

        threading.Thread(target=serve, daemon=True).start()
        connection = HttpConnection("127.0.0.1", listener.getsockname()[1])
        connection.connect(JOIN_S)
        connections.append(connection)
        return connection

    yield start
    for connection in connections:
        connection.close()
    for listener in listeners:
        listener.close()


def test_a_chunked_stream_gives_whole_lines_whatever_the_chunk_boundaries(
    answering: Callable[[Answer], HttpConnection],
) -> None:
    def stream(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}\n'):  # lines cut anywhere
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.sendall(b"0\r\n\r\n")

    opened = answering(stream).open_stream("/v3/watch", b"{}", {}, JOIN_S)
    opened.settimeout(JOIN_S)
    try:
        assert opened.status == 200
        lines = iter(opened.next_line, None)
        assert list(lines) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    finally:
        opened.close()


def test_an_answer_read_to_the_close_and_one_by_length_are_whole(
    answering: Callable[[Answer], HttpConnection],
) -> None:
    def until_close(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + b'{"x":1}')  # no length: ends at the close

    answer = answering(until_close).request("/v3/kv/range", b"{}", {}, JOIN_S)
    assert (answer.status, answer.body) == (200, b'{"x":1}')

    def sized(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nNot Found")

    answer = answering(sized).request("/v3/kv/range", b"{}", {}, JOIN_S)
    assert (answer.status, answer.body) == (404, b"Not Found")


def test_an_answer_cut_short_is_no_answer_not_a_protocol_error(
    answering: Callable[[Answer], HttpConnection],
) -> None:
    # A write whose answer broke off may have been applied: that must read as
    # "no answer", never as "something that is not HTTP".
    def cut(conn: socket.socket) -> None:
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"header"')

    with pytest.raises(NoAnswer):
        answering(cut).request("/v3/kv/put", b"{}", {}, JOIN_S)


def test_a_peer_that_is_not_http_is_named_at_once(
    answering: Callable[[Answer], HttpConnection],
) -> None:
    ready = threading.Event()

    def ssh(conn: socket.socket) -> None:
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")  # and then waits: no blank line ever comes
        ready.wait(JOIN_S)

    try:
        with pytest.raises(NotHttp, match=r"not HTTP \(it began b'SSH"):
            answering(ssh).request("/v3/kv/range", b"{}", {}, JOIN_S)
    finally:
        ready.set()


def test_a_kept_alive_connection_serves_the_next_request(
    answering: Callable[[Answer], HttpConnection],
) -> None:
    def two(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        _read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n[1]")

    connection = answering(two)
    assert connection.request("/a", b"", {}, JOIN_S).body == b"{}"
    assert not connection.dropped()
    assert connection.request("/b", b"", {}, JOIN_S).body == b"[1]"
