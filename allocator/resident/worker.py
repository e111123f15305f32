"""One command in a forked worker: the client's environment, files and limits, then the CLI.

The worker becomes its client before it runs anything: environment (and the
time zone it names), working directory, umask, resource limits, the signals
it ignores, and the client's stdin, stdout and stderr. A command that starts
the user's processes (``run``) is served only when nothing else they would
inherit differs (:mod:`allocator.resident.context`) and every limit could be
taken on exactly; otherwise the worker declines and the client runs it
itself. It runs the command only after the client said go. A thread reads
the connection meanwhile: a signal the client relays is raised here, and a
connection that closes (the client killed outright) kills the worker too, as
it would have died with the client; for ``run`` it is a hangup instead, so
the command's whole tree is stopped and the GPUs are given back at once,
rather than when the lease expires.
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

from allocator.resident import context, wire
from allocator.util.command_words import command_word

__all__ = ["serve_one"]

#: Descriptors a request carries: the client's stdin, stdout and stderr.
_STDIO = 3


def serve_one(connection: socket.socket, client: int) -> int:
    """Run process ``client``'s command; the worker's exit status (the client has its own copy)."""
    try:
        request, descriptors = _receive(connection)
    except (OSError, ValueError):
        return 0  # a client that went away or spoke another protocol: nothing ran
    argv = [os.fsdecode(word) for word in request[1]]
    word = command_word(argv)
    if word not in wire.SERVED:
        connection.sendall(wire.DECLINED)
        return 0
    try:
        exact = _become(request, descriptors)
    except OSError:  # e.g. its working directory is gone: the client says so itself
        connection.sendall(wire.DECLINED)
        return 0
    starts = word in wire.STARTS_PROCESSES
    if starts and (not exact or context.difference(client) is not None):
        connection.sendall(wire.DECLINED)  # its processes would not be the client's own
        return 0
    connection.sendall(wire.ACCEPTED + os.getpid().to_bytes(4, "big"))
    if connection.recv(1) != wire.GO:
        return 0
    finished = threading.Event()
    lost = signal.SIGHUP if starts else signal.SIGKILL
    threading.Thread(target=_watch, args=(connection, finished, lost), daemon=True).start()
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


def _become(request: wire.Request, descriptors: list[int]) -> bool:
    """Take on the client's environment, directory, umask, limits, signals and stdio.

    Whether every limit was taken on exactly (one above what the server may
    raise to is kept at the server's).
    """
    _, argv, environ, cwd, mask, limits, ignored = request
    os.chdir(cwd)
    os.environb.clear()
    os.environb.update(environ)
    time.tzset()
    os.umask(mask)
    exact = _limit(limits)
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
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD", "SIGTTIN", "SIGTTOU"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGTSTP, _stop)
    for number in ignored:
        signal.signal(number, signal.SIG_IGN)
    return exact


def _stop(_signum: int, _frame: object) -> None:
    """Ctrl-Z (the client relays it): stop, as SIGTSTP's default would in a terminal's group.

    Its default is discarded here, in the server's orphaned process group;
    ``run`` puts its own handler in place (stop the command's tree first).
    """
    os.kill(os.getpid(), signal.SIGSTOP)


def _text(
    descriptor: int, mode: str, encoding: str, errors: str | None, *, line_buffering: bool
) -> io.TextIOWrapper:
    """A text stream over ``descriptor``, as Python makes its standard streams."""
    raw = open(descriptor, mode, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, line_buffering=line_buffering)


def _limit(limits: list[tuple[int, int, int]]) -> bool:
    """Take on the client's limits; whether every one was taken on exactly."""
    exact = True
    for which, soft, hard in limits:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):  # above what the server may take: keep the lower
            exact = False
            current = resource.getrlimit(which)[1]
            capped = current if hard == resource.RLIM_INFINITY else min(hard, current)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (min(soft, capped), capped))
    return exact


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


def _watch(connection: socket.socket, finished: threading.Event, lost: int) -> None:
    """Raise the signals the client relays; signal ``lost`` to this worker when the client goes."""
    pending = b""
    while True:
        try:
            chunk = connection.recv(64)
        except OSError:
            chunk = b""
        if not chunk:
            if not finished.is_set():
                os.kill(os.getpid(), lost)
            return
        pending += chunk
        while len(pending) >= 2 and pending[:1] == wire.SIGNAL:
            os.kill(os.getpid(), pending[1])
            pending = pending[2:]
        if pending[:1] not in (b"", wire.SIGNAL):
            pending = b""  # not of this protocol: ignore it
