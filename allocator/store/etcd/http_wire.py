"""HTTP/1.1 for JSON requests and newline-delimited JSON streams: our sockets, h11's parsing.

``h11`` reads and writes the protocol (status line, headers, chunked or
sized bodies, keep-alive); it does no I/O. This module owns the socket:
connecting within a budget, TLS, TCP keep-alive probes, the deadline of
each answer, noticing a kept-alive connection the server closed while idle.
Why not ``http.client``: it loads ``email.parser`` and ``ssl`` when it is
imported, ~25 ms of every one-shot command's start-up against ~2 ms for
h11, and its streamed reads cannot be bounded by one deadline.

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

import h11
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
#: The longest status line and headers accepted (h11 refuses longer ones).
_MAX_HEAD = 64 * 1024
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
    """h11's events for one answer, each ``recv`` bounded by the answer's deadline."""

    def __init__(self, sock: socket.socket, parser: h11.Connection) -> None:
        self.sock = sock
        self.parser = parser
        #: When the answer being read must be complete (``time.monotonic()``; None: never).
        self.deadline: float | None = None
        self._start = b""  # the first bytes of an answer, until they show it is HTTP
        self._checking = False
        self._closed = False  # the peer closed the connection (h11 has been told)

    def expect_answer(self, deadline: float) -> None:
        """A request went out: its answer must be complete by ``deadline``."""
        self.deadline = deadline
        self._start, self._checking = b"", True

    def event(self) -> object:
        """The next event of the answer (``Response``, ``Data``, ``EndOfMessage``...).

        The connection closing where the answer cannot end is
        ``ConnectionResetError`` (no answer), not a protocol error.
        """
        while True:
            try:
                event = self.parser.next_event()
            except h11.RemoteProtocolError:
                if self._closed:
                    raise ConnectionResetError("the server closed the connection") from None
                raise
            if isinstance(event, h11.ConnectionClosed) or (event is h11.NEED_DATA and self._closed):
                raise ConnectionResetError("the server closed the connection")
            if event is not h11.NEED_DATA:
                return event
            self._fill()

    def _fill(self) -> None:
        if self.deadline is not None:  # a server trickling bytes must not outlast the budget
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(left)
        data = self.sock.recv(_CHUNK)
        if self._checking:
            self._check_start(data)
        self._closed = not data
        self.parser.receive_data(data)  # b"": closed, which may end a body read to the close

    def _check_start(self, data: bytes) -> None:
        # h11 waits for a whole head before judging it; a server that is not HTTP at
        # all (an SSH banner, say) may never send one, so the first bytes decide.
        self._start += data[:8]
        if not b"HTTP/".startswith(self._start[:5]):
            raise _NotHttpStart(self._start[:80])
        self._checking = len(self._start) < 5

    def head(self) -> tuple[int, dict[str, str]]:
        """The answer's status and headers (names lower-cased)."""
        event = self.event()
        while isinstance(event, h11.InformationalResponse):  # "100 Continue": not the answer
            event = self.event()
        if not isinstance(event, h11.Response):
            raise ValueError(f"expected an answer, got {type(event).__name__}")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
        return event.status_code, headers

    def data(self) -> bytes | None:
        """The next piece of the body; ``None`` once it has ended."""
        event = self.event()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            return None
        raise ValueError(f"expected the body, got {type(event).__name__}")

    def body(self) -> bytes:
        """The whole body."""
        parts: list[bytes] = []
        total = 0
        while (data := self.data()) is not None:
            total += len(data)
            if total > MAX_BODY_BYTES:
                raise ValueError("answer too large")
            parts.append(data)
        return b"".join(parts)


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
        self._reader = _Reader(
            sock, h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        )

    def dropped(self) -> bool:
        """Whether the idle connection was closed by the server (or holds unread junk).

        Checked before reusing a connection, so a request is never written
        into a connection that is already gone (where it could not be told
        apart from one lost after it was sent).
        """
        if self.sock is None or self._reader is None:
            return True
        if self._reader.parser.our_state is not h11.IDLE or self._reader.parser.trailing_data[0]:
            return True  # the last answer was not read to its end, or bytes came after it
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
            status, answer_headers = reader.head()
            data = reader.body()
        except (OSError, ValueError, h11.ProtocolError) as exc:
            self.close()
            raise _failure(exc) from exc
        if reader.parser.our_state is h11.DONE and reader.parser.their_state is h11.DONE:
            reader.parser.start_next_cycle()  # kept alive for the next request
        else:  # "Connection: close", or an HTTP/1.0 answer
            self.close()
        return Response(status, answer_headers, data)

    def open_stream(
        self, path: str, body: bytes, headers: dict[str, str], timeout: float
    ) -> Stream:
        """``POST path`` and return the streamed answer (the connection is the stream's now)."""
        reader = self._send(path, body, headers, timeout)
        try:
            status, answer_headers = reader.head()
        except (OSError, ValueError, h11.ProtocolError) as exc:
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
        parser = self._reader.parser
        fields = [
            ("Host", self._host_header),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers.items(),
        ]
        try:
            wire = parser.send(h11.Request(method="POST", target=path, headers=fields))
            wire = (wire or b"") + (parser.send(h11.Data(data=body)) or b"")
            wire += parser.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:  # a header our caller should never give
            raise NotSent(f"bad request: {exc}", exc) from exc
        try:
            self.sock.settimeout(max(timeout, 0.001))
            self.sock.sendall(wire)
        except OSError as exc:
            self.close()
            raise NoAnswer(_describe(exc), exc) from exc
        self._reader.expect_answer(time.monotonic() + max(timeout, 0.001))
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
        except (OSError, ValueError, h11.ProtocolError) as exc:
            raise _failure(exc) from exc

    def read_all(self) -> bytes:
        """The rest of the body (for an error answer)."""
        try:
            while not self._ended:
                self._more()
        except (OSError, ValueError, h11.ProtocolError) as exc:
            raise _failure(exc) from exc
        data, self._pending = bytes(self._pending), bytearray()
        return data

    def _more(self) -> None:
        data = self._reader.data()
        if data is None:
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


class _NotHttpStart(ValueError):
    """The first bytes of an answer are not an HTTP status line."""


def _failure(exc: BaseException) -> HttpError:
    if isinstance(exc, _NotHttpStart):
        return NotHttp(f"the answer is not HTTP (it began {exc.args[0]!r})", exc)
    if isinstance(exc, h11.RemoteProtocolError):
        return NotHttp(f"the answer is not HTTP ({exc})", exc)
    if isinstance(exc, (ValueError, h11.ProtocolError)):
        return NotHttp(f"malformed HTTP answer: {exc}", exc)
    return NoAnswer(_describe(exc), exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    return text or type(exc).__name__
