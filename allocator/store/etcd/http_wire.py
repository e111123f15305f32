"""A small HTTP/1.1 client for JSON requests and newline-delimited JSON streams.

Why not ``http.client``: it loads ``email.parser`` and ``ssl`` when it is
imported, about 25 ms of every one-shot command's start-up (measured on
these machines; a whole ``etcdctl put`` process takes 16 ms). This client
needs only ``socket``, and ``ssl`` only for a TLS endpoint. It does what a
JSON API such as etcd's gateway needs and nothing more: ``POST`` with a
body, ``Content-Length`` or chunked answers, keep-alive, and streamed
answers read line by line.

What can go wrong is said precisely, because a caller must know whether a
write may have reached the server:

* :class:`NotSent`: the connection (TCP, TLS) could not be made; nothing
  was sent;
* :class:`NoAnswer`: the request went out and no complete answer came
  back (timeout, connection reset or closed);
* :class:`NotHttp`: something answered, but not in HTTP.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import TYPE_CHECKING

from msgspec import Struct

if TYPE_CHECKING:
    import ssl

__all__ = [
    "HttpConnection",
    "HttpError",
    "NoAnswer",
    "NotHttp",
    "NotSent",
    "Response",
    "Stream",
    "keep_probing",
]

#: Refuse answers larger than this (an etcd range of 1,000 hosts x 8 GPUs is ~2 MB).
MAX_BODY_BYTES = 512 * 1024 * 1024
_MAX_LINE = 64 * 1024
_MAX_HEADERS = 100
_CHUNK = 64 * 1024


class HttpError(Exception):
    """Base of this module's errors; ``cause`` is the underlying exception, if any."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class NotSent(HttpError):
    """The connection could not be made: the request never left this process."""


class NoAnswer(HttpError):
    """The request was sent but no complete answer came back."""


class NotHttp(HttpError):
    """The peer answered with something that is not HTTP/1.x."""


class Response(Struct, frozen=True):
    """A complete answer: status code, lower-cased headers, body (a Struct: cheap to define)."""

    status: int
    headers: dict[str, str]
    body: bytes


def keep_probing(sock: socket.socket) -> None:
    """Turn on TCP keep-alive probes: a peer that vanished is noticed within ~30 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class _Reader:
    """Buffered reads from a socket, each bounded by the socket's timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        #: When the answer being read must be complete (``time.monotonic()``; None: never).
        self.deadline: float | None = None

    def _fill(self) -> None:
        if self.deadline is not None:  # a server trickling bytes must not outlast the budget
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(left)
        data = self.sock.recv(_CHUNK)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self.buffer += data

    def line(self) -> bytes:
        """One CRLF- or LF-terminated line, without its terminator."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end])
                del self.buffer[: end + 1]
                return line.rstrip(b"\r")
            if len(self.buffer) > _MAX_LINE:
                raise ValueError("header line too long")
            self._fill()

    def exactly(self, count: int) -> bytes:
        """``count`` bytes."""
        while len(self.buffer) < count:
            self._fill()
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def chunk(self) -> bytes | None:
        """The next chunk of a chunked body; ``None`` after the last one."""
        size_line = self.line().split(b";", 1)[0].strip()
        size = int(size_line, 16)
        if size < 0 or size > MAX_BODY_BYTES:
            raise ValueError(f"bad chunk size {size}")
        if size == 0:
            while self.line():  # trailers, up to the blank line
                pass
            return None
        data = self.exactly(size)
        self.exactly(2)  # CRLF after the chunk
        return data


class HttpConnection:
    """One keep-alive connection to ``host:port`` (TLS when ``tls`` is a context)."""

    def __init__(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, *, probe: bool = False
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.probe = probe
        self.sock: socket.socket | None = None
        self._reader: _Reader | None = None
        self._host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def connected(self) -> bool:
        """Whether a socket is open (it may still have been closed by the peer)."""
        return self.sock is not None

    def connect(self, timeout: float) -> None:
        """Open the connection (TCP, then TLS) within ``timeout`` seconds; ``NotSent`` if not."""
        self.close()
        try:
            # An ASCII host as bytes: a str is IDNA-encoded first, and loading that codec
            # (with stringprep and unicodedata) costs a one-shot command a millisecond.
            host = self.host.encode("ascii") if self.host.isascii() else self.host
            address = (host, self.port)  # getaddrinfo takes bytes too; typeshed says str
            sock = socket.create_connection(address, timeout=max(timeout, 0.001))  # type: ignore[arg-type]
        except OSError as exc:
            raise NotSent(_describe(exc), exc) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.probe:
                keep_probing(sock)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:  # ssl.SSLError is an OSError
            sock.close()
            raise NotSent(_describe(exc), exc) from exc
        self.sock = sock
        self._reader = _Reader(sock)

    def dropped(self) -> bool:
        """Whether the idle connection was closed by the server (or holds unread junk).

        Checked before reusing a connection, so a request is never written
        into a connection that is already gone (where it could not be told
        apart from one lost after it was sent).
        """
        if self.sock is None:
            return True
        if self._reader is not None and self._reader.buffer:
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable) and self._peer_closed(self.sock)

    def _peer_closed(self, sock: socket.socket) -> bool:
        """A readable idle socket: closed (or junk) unless only TLS housekeeping arrived."""
        sock.setblocking(False)
        try:
            if self.tls is None:
                sock.recv(1, socket.MSG_PEEK)
            else:
                sock.recv(1)  # TLS 1.3 session tickets make an idle socket readable
        except BlockingIOError:
            return False
        except OSError as exc:
            return type(exc).__name__ != "SSLWantReadError"
        return True  # b"": closed; bytes nobody asked for: not reusable either

    def request(self, path: str, body: bytes, headers: dict[str, str], timeout: float) -> Response:
        """``POST path`` and read the whole answer within ``timeout`` seconds."""
        reader = self._send(path, body, headers, timeout)
        try:
            status, answer_headers = _head(reader)
            data = _body(reader, answer_headers)
        except (OSError, ValueError) as exc:
            self.close()
            raise _failure(exc) from exc
        if answer_headers.get("connection", "").lower() == "close":
            self.close()
        return Response(status, answer_headers, data)

    def open_stream(
        self, path: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> Stream:
        """``POST path`` and return the streamed answer (the connection is the stream's now)."""
        reader = self._send(path, body, headers, timeout)
        try:
            status, answer_headers = _head(reader)
        except (OSError, ValueError) as exc:
            self.close()
            raise _failure(exc) from exc
        sock, self.sock, self._reader = self.sock, None, None
        assert sock is not None
        reader.deadline = None  # the stream's reads are bounded by Stream.settimeout
        return Stream(sock, reader, status, answer_headers)

    def close(self) -> None:
        """Close the socket. Idempotent."""
        sock, self.sock, self._reader = self.sock, None, None
        if sock is not None:
            sock.close()

    def _send(self, path: str, body: bytes, headers: dict[str, str], timeout: float) -> _Reader:
        if self.sock is None or self._reader is None:
            raise NotSent("not connected")
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {self._host_header}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.sock.settimeout(max(timeout, 0.001))
            self.sock.sendall(head + body)
        except OSError as exc:
            self.close()
            raise NoAnswer(_describe(exc), exc) from exc
        self._reader.deadline = time.monotonic() + max(timeout, 0.001)
        return self._reader


class Stream:
    """A streamed answer: its status and headers, then its body line by line."""

    def __init__(
        self, sock: socket.socket, reader: _Reader, status: int, headers: dict[str, str]
    ) -> None:
        self.sock = sock
        self.status = status
        self.headers = headers
        self._reader = reader
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._left = int(length) if length and length.isdigit() else None
        self._pending = bytearray()
        self._ended = False

    def settimeout(self, timeout: float | None) -> None:
        """Bound each later read (``None``: wait as long as it takes)."""
        self.sock.settimeout(timeout)

    def next_line(self) -> bytes | None:
        """The next non-empty line of the body; ``None`` once the body has ended.

        Raises ``NoAnswer`` if the connection breaks or a read times out.
        """
        try:
            while True:
                end = self._pending.find(b"\n")
                if end >= 0:
                    line = bytes(self._pending[:end]).strip()
                    del self._pending[: end + 1]
                    if line:
                        return line
                    continue
                if self._ended:
                    return None
                self._more()
        except (OSError, ValueError) as exc:
            raise _failure(exc) from exc

    def read_all(self) -> bytes:
        """The rest of the body (for an error answer)."""
        try:
            while not self._ended:
                self._more()
        except (OSError, ValueError) as exc:
            raise _failure(exc) from exc
        data, self._pending = bytes(self._pending), bytearray()
        return data

    def _more(self) -> None:
        if self._chunked:
            data = self._reader.chunk()
        elif self._left is not None:  # a body of known length (an error answer)
            data = self._reader.exactly(self._left) if self._left else None
            self._left = 0
        else:  # until the server closes the connection
            data = bytes(self._reader.buffer) or self._reader.sock.recv(_CHUNK)
            self._reader.buffer.clear()
        if not data:
            self._ended = True
            return
        if len(self._pending) + len(data) > MAX_BODY_BYTES:
            raise ValueError("streamed message too large")
        self._pending += data

    def close(self) -> None:
        """End the stream: shut the socket down (waking a reader in another thread)."""
        with contextlib.suppress(OSError):  # already closed by the peer
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def _head(reader: _Reader) -> tuple[int, dict[str, str]]:
    status_line = reader.line()
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _NotHttpLine(status_line[:80])
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = reader.line()
        if not line:
            return int(parts[1]), headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    raise ValueError("too many header lines")


def _body(reader: _Reader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        total = 0
        while (chunk := reader.chunk()) is not None:
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise ValueError("answer too large")
            parts.append(chunk)
        return b"".join(parts)
    length = int(headers.get("content-length", "0") or 0)
    if length < 0 or length > MAX_BODY_BYTES:
        raise ValueError(f"bad content length {length}")
    return reader.exactly(length)


class _NotHttpLine(ValueError):
    """The first line of an answer is not an HTTP status line."""


def _failure(exc: BaseException) -> HttpError:
    if isinstance(exc, _NotHttpLine):
        return NotHttp(f"the answer is not HTTP (it began {exc.args[0]!r})", exc)
    if isinstance(exc, ValueError):
        return NotHttp(f"malformed HTTP answer: {exc}", exc)
    return NoAnswer(_describe(exc), exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return text or type(exc).__name__
