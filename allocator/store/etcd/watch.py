"""Watches over etcd's JSON gateway: one streamed ``/v3/watch`` answer per watch.

Each watch has a connection of its own (the store's keep-alive connection
stays free for calls) and a daemon thread that reads the stream's lines and
feeds an :class:`~allocator.store.etcd.event_queue.EventQueue`; ``next()`` takes
from the queue. Every way the stream can end reaches ``next()`` as an
error: the server cancelling the watch (refused, compacted), the connection
closing, or TCP keep-alive probes finding that the peer vanished.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.errors import AllocatorError, Compacted, StoreError, StoreUnavailable
from allocator.store.base import Event, Watch
from allocator.store.etcd.event_queue import EventQueue
from allocator.store.etcd.http_wire import HttpConnection, HttpError, NotHttp, Stream
from allocator.store.etcd.json_api import Json, event_of
from allocator.store.etcd.rules import (
    Code,
    EtcdStatus,
    token_is_stale,
    translate_status,
    watch_error,
)

if TYPE_CHECKING:
    from allocator.store.etcd.connection import Endpoint

__all__ = ["EtcdWatch", "OpenedWatch", "open_watch_stream", "read_message"]


@dataclass
class OpenedWatch:
    """A watch stream the server has created: the stream, where it runs, what came first."""

    stream: Stream
    where: str
    first: list[Event]
    error: AllocatorError | None = None


def read_message(
    stream: Stream, where: str, *, first: bool = False
) -> tuple[list[Event], AllocatorError | None] | None:
    """The next message of a watch stream: its events and the error it carries, if any.

    ``None`` when the stream ended. Raises ``NoAnswer`` if the connection
    broke or timed out, ``NotHttp`` if a line is not JSON, or (``first``) if
    the stream's first message is not etcd's (it names the cluster).
    """
    line = stream.next_line()
    if line is None:
        return None
    try:
        message = json.loads(line)
    except ValueError:
        raise NotHttp(f"the watch stream sent {line[:80]!r}, not JSON") from None
    if not isinstance(message, dict):
        raise NotHttp(f"the watch stream sent {line[:80]!r}, not a JSON object")
    if "error" in message:  # the gateway ends a stream that failed with this
        error = message["error"] if isinstance(message["error"], dict) else {}
        code = int(error.get("grpc_code") or error.get("code") or Code.UNKNOWN)
        raise EtcdStatus(code, str(error.get("message") or message["error"]))
    result: Json = message.get("result") or {}
    header = result.get("header")
    if first and not (isinstance(header, dict) and header.get("cluster_id")):
        raise NotHttp(f"the watch stream began {line[:80]!r}, not etcd's answer")
    failure = watch_error(
        int(result.get("compact_revision") or 0),
        bool(result.get("canceled")),
        str(result.get("cancel_reason") or ""),
        where,
    )
    events = (event_of(item) for item in result.get("events") or [])
    return [event for event in events if event is not None], failure


def open_watch_stream(endpoint: Endpoint, request: Json, until: float) -> OpenedWatch:
    """Open a watch on a new connection to ``endpoint`` and wait for etcd to create it.

    A refusal raises (``EtcdStatus``, or the translated cancel reason, so a
    stale token can be renewed by the caller); a compacted start revision is
    kept for ``next()``, as the protocol says.
    """
    connection = HttpConnection(endpoint.host, endpoint.port, endpoint.tls, probe=True)
    connection.connect(until - time.monotonic())
    body = json.dumps(request, separators=(",", ":")).encode("utf-8")
    stream = connection.open_stream("/v3/watch", body, endpoint.headers(), until - time.monotonic())
    try:
        if stream.status != 200:
            from allocator.store.etcd.connection import status_of_answer

            raise status_of_answer(stream.status, stream.read_all(), "/v3/watch")
        first = read_message(stream, endpoint.name, first=True)
        if first is None:
            raise StoreUnavailable(f"etcd at {endpoint.name} ended the watch before creating it")
        events, error = first
        if error is not None and not isinstance(error, Compacted):
            if token_is_stale(str(error)):  # renewed by the caller, like a refused call
                raise EtcdStatus(Code.UNAUTHENTICATED, str(error))
            raise error
    except BaseException:
        stream.close()
        raise
    return OpenedWatch(stream, endpoint.name, events, error)


class EtcdWatch:
    """A prefix watch; see :class:`~allocator.store.base.Watch`."""

    def __init__(self, opened: OpenedWatch, forget: Callable[[EtcdWatch], None]) -> None:
        self._stream = opened.stream
        self._where = opened.where
        self._forget = forget
        self.queue = EventQueue()
        if opened.first:
            self.queue.put(opened.first)
        if opened.error is not None:
            self.queue.fail(opened.error)
        self._thread = threading.Thread(
            target=self._pump, name=f"allocator-etcd-watch {opened.where}", daemon=True
        )

    def start(self) -> None:
        """Start reading the stream in the background."""
        self._stream.settimeout(None)  # idle for days is normal; keep-alive probes guard it
        self._thread.start()

    def next(self, timeout: float) -> list[Event]:
        """Return the next batch of events, or ``[]`` after ``timeout`` seconds."""
        return self.queue.next(timeout)

    def close(self) -> None:
        """Stop watching (the connection is shut, which ends the server's watch). Idempotent."""
        if self.queue.close():
            self._forget(self)
            self._stream.close()

    def _pump(self) -> None:
        try:
            self.queue.fail(self._read_until_the_end())
        finally:
            # However the stream ended, next() must say so; the first error wins.
            self.queue.fail(StoreUnavailable(f"etcd at {self._where}: the watch stream ended"))
            self._stream.close()

    def _read_until_the_end(self) -> AllocatorError:
        """Feed the queue until the stream ends; return the error that ended it."""
        try:
            while not self.queue.closed:
                message = read_message(self._stream, self._where)
                if message is None:
                    break
                events, error = message
                if events:
                    self.queue.put(events)
                if error is not None:
                    return error
        except EtcdStatus as exc:
            return translate_status(exc.code, exc.details, self._where)
        except HttpError as exc:
            return StoreUnavailable(f"etcd at {self._where}: the watch broke ({exc})")
        except Exception as exc:  # a bug of ours must still end the watch, not hang it
            return StoreError(f"etcd at {self._where}: watch failed: {exc!r}")
        return StoreUnavailable(f"etcd at {self._where}: the watch stream ended")


if TYPE_CHECKING:  # mypy checks the class against the protocol
    _WATCH: type[Watch] = EtcdWatch
