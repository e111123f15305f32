"""The systemd side of ``sd_notify``: a datagram socket that collects what the agent says."""

from __future__ import annotations

import os
import socket
import time
import uuid

__all__ = ["NotifySocket"]


class NotifySocket:
    """A unix datagram socket; pass :attr:`address` as ``NOTIFY_SOCKET``.

    By default it lives in the abstract namespace (``@name``), as systemd's
    own does in containers; ``path`` binds a socket file instead.
    """

    def __init__(self, path: str | None = None) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if path is None:
            name = f"allocator-test-{uuid.uuid4().hex}"
            self._socket.bind("\0" + name)
            self.address = "@" + name
        else:
            self._socket.bind(path)
            self.address = path
        self.messages: list[list[str]] = []
        self._path = path

    def receive(self, timeout: float) -> list[str] | None:
        """The next datagram's lines, or ``None`` if none came within ``timeout`` seconds."""
        self._socket.settimeout(max(timeout, 0.001))
        try:
            data = self._socket.recv(65536)
        except (TimeoutError, BlockingIOError):
            return None
        lines = data.decode().split("\n")
        self.messages.append(lines)
        return lines

    def wait_for(self, line: str, timeout: float) -> list[str]:
        """Receive until a datagram holds ``line``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            lines = self.receive(left)
            if lines is not None and line in lines:
                return lines
        raise AssertionError(f"no {line!r} from the agent within {timeout} s: {self.messages}")

    def drain(self) -> None:
        """Forget what is queued."""
        while self.receive(0.0) is not None:
            pass

    def close(self) -> None:
        """Close the socket (and remove its file, if it has one)."""
        self._socket.close()
        if self._path is not None:
            os.unlink(self._path)
