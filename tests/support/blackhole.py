"""A store endpoint that accepts connections and never answers, for hang tests.

Like a server that is up but stuck (or a firewall that lets the handshake
through): TCP connections complete, bytes are read and discarded, and no
reply ever comes, so every client call waits for its own deadline.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

__all__ = ["Blackhole"]


class Blackhole:
    """One loopback listener; ``endpoint`` is its ``127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._connections: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="blackhole", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``."""
        port = self._listener.getsockname()[1]
        return f"127.0.0.1:{port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _addr = self._listener.accept()
            except OSError:
                return
            self._connections.append(conn)  # held open, never read from, never answered

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed.set()
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in self._connections:
            conn.close()
        self._thread.join(5)
