"""Telling systemd the agent is ready and alive: the ``sd_notify`` protocol, by hand.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a unix datagram
socket; a leading ``@`` names an abstract socket) and, with ``WatchdogSec=``,
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``). The agent sends ``READY=1`` once it
has adopted its workers, ``WATCHDOG=1`` from its supervision loop at half the
watchdog interval, ``STATUS=...`` lines for ``systemctl status`` and
``STOPPING=1`` on shutdown. A loop stuck longer than the interval stops
pinging, and systemd restarts the agent, which adopts its workers.

The variables are taken out of the environment when read, so no worker
inherits them (a worker could otherwise ping on the agent's behalf).
Everything here is a no-op outside systemd.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

__all__ = ["Notifier", "notifier_from_environ"]

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Send state lines to systemd's notification socket (if any)."""

    def __init__(self, address: str | None, watchdog_seconds: float | None = None) -> None:
        self.address = address
        #: How often to ping: half the watchdog interval, as sd_watchdog_enabled(3) advises.
        self.ping_every = watchdog_seconds / 2 if watchdog_seconds else None
        self._next_ping = 0.0
        self._socket: socket.socket | None = None

    def send(self, *lines: str) -> bool:
        """Send ``lines`` as one datagram; ``False`` when there is no socket or it failed."""
        if not self.address:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                )
            self._socket.sendto("\n".join(lines).encode(), target)
        except OSError:  # systemd gone or restarting: the next ping tries again
            return False
        return True

    def ready(self, status: str) -> None:
        """The agent has adopted its workers and supervises them."""
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        """A one-line state for ``systemctl status``."""
        self.send(f"STATUS={status}")

    def stopping(self) -> None:
        """The agent is shutting down (workers are being stopped or kept)."""
        self.send("STOPPING=1", "STATUS=stopping")

    @property
    def next_ping(self) -> float | None:
        """When the next watchdog ping is due (``None`` without a watchdog)."""
        return self._next_ping if self.ping_every is not None else None

    def ping(self, now: float) -> None:
        """Ping the watchdog if half an interval has passed since the last ping."""
        if self.ping_every is None or now < self._next_ping:
            return
        self._next_ping = now + self.ping_every
        self.send("WATCHDOG=1")

    def close(self) -> None:
        """Close the socket."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def notifier_from_environ(environ: MutableMapping[str, str], pid: int | None = None) -> Notifier:
    """A :class:`Notifier` from systemd's variables, which are removed from ``environ``.

    The watchdog is on only when ``WATCHDOG_USEC`` is a positive number and
    ``WATCHDOG_PID`` (if set) is this process.
    """
    values = {name: environ.pop(name, None) for name in _VARIABLES}
    address = values["NOTIFY_SOCKET"] or None
    watchdog: float | None = None
    usec = values["WATCHDOG_USEC"]
    owner = values["WATCHDOG_PID"]
    this = os.getpid() if pid is None else pid
    if usec and usec.isdigit() and int(usec) > 0 and (not owner or owner == str(this)):
        watchdog = int(usec) / 1_000_000
    return Notifier(address, watchdog)
