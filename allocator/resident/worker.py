"""One command in a forked worker: the client's environment, files and limits, then the CLI.

The worker becomes its client before it runs anything: environment (and the
time zone it names), working directory, umask, resource limits, and the
client's stdin, stdout and stderr. It runs the command only after the client
said go. A thread reads the connection meanwhile: a signal the client relays
is raised here, and a connection that closes (the client killed outright)
kills the worker too, as it would have died with the client.
"""

from __future__ import annotations

import array
import contextlib
import io
import os
import resource
import signal
import socket
import sys
import threading
import time

from allocator.resident import wire
from allocator.util.command_words import command_word

__all__ = ["serve_one"]

#: Descriptors a request carries: the client's stdin, stdout and stderr.
_STDIO = 3


def serve_one(connection: socket.socket) -> int:
    """Run one client's command; the worker's exit status (the client has its own copy)."""
    try:
        request, descriptors = _receive(connection)
    except (OSError, ValueError):
        return 0  # a client that went away or spoke another protocol: nothing ran
    argv = [os.fsdecode(word) for word in request[1]]
    if command_word(argv) not in wire.SERVED:
        connection.sendall(wire.DECLINED)
        return 0
    try:
        _become(request, descriptors)
    except OSError:  # e.g. its working directory is gone: the client says so itself
        connection.sendall(wire.DECLINED)
        return 0
    connection.sendall(wire.ACCEPTED + os.getpid().to_bytes(4, "big"))
    if connection.recv(1) != wire.GO:
        return 0
    finished = threading.Event()
    threading.Thread(target=_watch, args=(connection, finished), daemon=True).start()
    code = _run(argv)
    finished.set()
    with contextlib.suppress(OSError):
        connection.sendall(wire.EXITED + code.to_bytes(4, "big", signed=True))
    return code


def _receive(connection: socket.socket) -> tuple[wire.Request, list[int]]:
    """The request and the descriptors that came with its first bytes."""
    descriptors: list[int] = []
    data = b""
    room = socket.CMSG_SPACE(_STDIO * array.array("i").itemsize)
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk, ancillary, _flags, _address = connection.recvmsg(65536, room if not data else 0)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                found = array.array("i")
                found.frombytes(payload[: len(payload) - len(payload) % found.itemsize])
                descriptors.extend(found)
        if not chunk:
            raise ValueError("the client closed before its request was whole")
        data += chunk
    if len(descriptors) != _STDIO:
        raise ValueError("a request without the client's stdin, stdout and stderr")
    return wire.decode_request(data[4:]), descriptors


def _become(request: wire.Request, descriptors: list[int]) -> None:
    """Take on the client's environment, directory, umask, limits and stdio."""
    _, argv, environ, cwd, mask, limits = request
    os.chdir(cwd)
    os.environb.clear()
    os.environb.update(environ)
    time.tzset()
    os.umask(mask)
    _limit(limits)
    for target, descriptor in enumerate(descriptors):
        os.dup2(descriptor, target)
        os.close(descriptor)
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = _text(0, "rb", encoding, errors, line_buffering=False)
    sys.stdout = _text(1, "wb", encoding, errors, line_buffering=os.isatty(1))
    sys.stderr = _text(2, "wb", encoding, "backslashreplace", line_buffering=True)
    # What the interpreter started with is the server's /dev/null: `--help` asks
    # sys.__stdout__ for the terminal's width.
    streams = (("__stdin__", sys.stdin), ("__stdout__", sys.stdout), ("__stderr__", sys.stderr))
    for name, stream in streams:
        setattr(sys, name, stream)  # typeshed calls them final; CPython lets them be set
    sys.argv = ["allocator", *(os.fsdecode(word) for word in argv)]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def _text(
    descriptor: int, mode: str, encoding: str, errors: str | None, *, line_buffering: bool
) -> io.TextIOWrapper:
    """A text stream over ``descriptor``, as Python makes its standard streams."""
    raw = open(descriptor, mode, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, line_buffering=line_buffering)


def _limit(limits: list[tuple[int, int, int]]) -> None:
    for which, soft, hard in limits:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):  # above what the server may take: keep the lower
            current = resource.getrlimit(which)[1]
            capped = current if hard == resource.RLIM_INFINITY else min(hard, current)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (min(soft, capped), capped))


def _run(argv: list[str]) -> int:
    """The CLI's exit status for ``argv``, whatever way it ends."""
    from allocator.cli import main

    try:
        code: object = main(argv)
    except SystemExit as stop:  # `set --help` prints its help and exits 0
        code = stop.code
    except KeyboardInterrupt:
        code = 130
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _watch(connection: socket.socket, finished: threading.Event) -> None:
    """Raise the signals the client relays; die with the client."""
    pending = b""
    while True:
        try:
            chunk = connection.recv(64)
        except OSError:
            chunk = b""
        if not chunk:
            if not finished.is_set():
                os.kill(os.getpid(), signal.SIGKILL)
            return
        pending += chunk
        while len(pending) >= 2 and pending[:1] == wire.SIGNAL:
            os.kill(os.getpid(), pending[1])
            pending = pending[2:]
        if pending[:1] not in (b"", wire.SIGNAL):
            pending = b""  # not of this protocol: ignore it
