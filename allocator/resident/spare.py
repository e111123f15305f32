"""The spare: a worker forked before its client comes, so no command waits for a fork.

The server keeps one spare blocked in ``accept`` on the listening socket.
The spare that takes a connection tells the server (one byte on a pipe) and
the server forks the next spare while this one serves; a server that no
longer holds the code it loaded (a file changed) or its socket is told so
instead, and stops. A server that stops removes its socket and leaves its
spare be: a client that connected a moment before is still served, and a
spare whose server is gone exits at its next look (each second).
"""

from __future__ import annotations

import os
import signal
import socket
import struct
from collections.abc import Callable

from allocator.resident import wire
from allocator.resident.worker import serve_one

__all__ = ["STALE", "TAKEN", "Spare", "fork_spare"]

#: Spare -> server: a client was taken (fork the next spare).
TAKEN = b"t"
#: Spare -> server: the code or the socket is not the server's any more (stop).
STALE = b"s"
#: How often a spare waiting for a client checks that its server is alive.
LOOK_SECONDS = 1.0


class Spare:
    """What a spare needs from the server that forked it."""

    def __init__(
        self,
        listener: socket.socket,
        notes: int,
        current: Callable[[], bool],
        servers_own: tuple[int, ...],
    ) -> None:
        self.listener = listener
        self.notes = notes  # the pipe's write end
        self.current = current  # the server's code and socket still its own
        self.servers_own = servers_own  # the pipe's read end, the lock: closed at once
        self.server = os.getpid()


def fork_spare(spare: Spare) -> int:
    """Fork a spare; its pid (the child never returns)."""
    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for descriptor in spare.servers_own:  # a spare left behind must not hold the lock
            os.close(descriptor)
        code = _wait_and_serve(spare)
    finally:
        os._exit(code)


def _wait_and_serve(spare: Spare) -> int:
    spare.listener.settimeout(LOOK_SECONDS)
    while True:
        try:
            connection, _ = spare.listener.accept()
            break
        except TimeoutError:
            if os.getppid() != spare.server:
                return 0
    with connection:
        client = _same_user(connection)
        if client is None:
            os.write(spare.notes, TAKEN)
            return 0
        if not spare.current():
            connection.sendall(wire.DECLINED)
            os.write(spare.notes, STALE)
            return 0
        os.write(spare.notes, TAKEN)
        spare.listener.close()
        os.close(spare.notes)
        connection.setblocking(True)
        return serve_one(connection, client)


def _same_user(connection: socket.socket) -> int | None:
    """The peer's pid when its uid is ours (the socket's directory is ours alone; a second lock)."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return int(pid) if uid == os.getuid() else None
