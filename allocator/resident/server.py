"""The command server: one per user and installation, the CLI's modules loaded, a fork per command.

It runs single-threaded (a fork copies one thread), holds no store
connection (each worker opens its own) and stops after
:data:`IDLE_SECONDS` without a command (``ALLOCATOR_SERVER_IDLE`` overrides),
when its code changed on disk (an upgrade, an edit), or when another server
took its socket. A lock file makes two starting servers one.

Run by the door as ``python -m allocator.resident.server SOCKET``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import os
import pkgutil
import select
import signal
import socket
import sys
import sysconfig
from collections.abc import Sequence

import allocator
from allocator.resident import wire
from allocator.resident.spare import TAKEN, Spare, fork_spare

__all__ = [
    "IDLE_SECONDS",
    "PRELOAD_ALSO",
    "PRELOAD_SKIPPED",
    "code_fingerprint",
    "main",
    "preload",
    "warm",
]

IDLE_SECONDS = 600.0
#: What a served command never needs: the agent, the web server, torch, vendor libraries.
PRELOAD_SKIPPED = (
    "allocator.__main__",
    "allocator.agent",
    "allocator.serve",
    "allocator.torch",
    "allocator.worker",
    "allocator.resident",
    "allocator.cli.agent",
    "allocator.cli.serve",
    "allocator.cli.demo",
    "allocator.store.consul",
)
#: What ``run`` loads beyond the CLI: its cgroup and subreaper calls, and a
#: declared job's worker plan (the environment the agent would give it).
PRELOAD_ALSO = (
    "allocator.agent.kernel.cgroups",
    "allocator.agent.kernel.procs",
    "allocator.agent.planning.desired",
    "ctypes",
    "encodings.ascii",
    "pwd",
)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve on the socket the door named, if it is this installation's and no server holds it."""
    words = list(sys.argv[1:] if argv is None else argv)
    package_dir = os.path.dirname(allocator.__file__)
    path = wire.socket_path(os.environ, package_dir)
    if len(words) != 1 or path != words[0]:
        return 2  # started for another installation or user: leave it to its own
    with open(path + ".lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # a server is already here
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        signal.signal(signal.SIGTERM, _stop)
        preload()
        warm()
        _serve(path, _idle_seconds(), lock.fileno())
    return 0


def preload() -> None:
    """Import every module a served command may load, so that none of its workers imports."""
    for found in pkgutil.walk_packages(allocator.__path__, "allocator."):
        if found.name.startswith(PRELOAD_SKIPPED):
            continue
        try:
            importlib.import_module(found.name)
        except Exception:  # e.g. an optional library not installed: a command loads it if run
            continue
    for name in PRELOAD_ALSO:
        importlib.import_module(name)


def warm() -> None:
    """Do once what each command's first call would: its parser, every record's decoder.

    Workers are forked from this process, so what is built here is built for
    all of them (a forked worker keeps nothing it builds).
    """
    import msgspec

    from allocator.cli import parser_for
    from allocator.records.codec import prepare_decoders

    for command in wire.SERVED:
        parser_for(command)
    structs = {
        value
        for name, module in list(sys.modules.items())
        if name.startswith("allocator.")
        for value in list(vars(module).values())
        if isinstance(value, type) and issubclass(value, msgspec.Struct)
    }
    for kind in structs:
        with contextlib.suppress(Exception):  # a generic or abstract record: built when used
            prepare_decoders([kind])


def code_fingerprint() -> tuple[tuple[str, int, int], ...]:
    """Each loaded allocator module's file with its mtime and size, and site-packages' mtime.

    A change means the code on disk is not the code loaded: the server must
    not serve it (a ``pip install -U`` or an edited source tree).
    """
    files = sorted(
        {
            found
            for name, module in list(sys.modules.items())
            if name.startswith("allocator") and (found := getattr(module, "__file__", None))
        }
    )
    files.append(_site_packages())
    found = []
    for name in files:
        try:
            facts = os.stat(name)
        except OSError:
            found.append((name, -1, -1))
        else:
            found.append((name, facts.st_mtime_ns, facts.st_size))
    return tuple(found)


@functools.cache
def _site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


def _idle_seconds() -> float:
    try:
        return max(0.1, float(os.environ.get("ALLOCATOR_SERVER_IDLE", IDLE_SECONDS)))
    except ValueError:
        return IDLE_SECONDS


def _serve(path: str, idle: float, lock: int) -> None:
    fingerprint = code_fingerprint()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a socket left by a server that died: the lock says none runs
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_mask)
    listener.listen(128)
    inode = os.stat(path).st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    notes, noted = os.pipe()
    spare = Spare(
        listener,
        noted,
        lambda: code_fingerprint() == fingerprint and _still_ours(path, inode),
        (notes, lock),
    )
    fork_spare(spare)
    try:
        while select.select([notes], [], [], idle)[0] and os.read(notes, 1) == TAKEN:
            fork_spare(spare)
    finally:
        listener.close()
        if _still_ours(path, inode):
            os.unlink(path)
            os.utime(path + ".lock", (0, 0))  # the next client starts a new one at once


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(0)  # through the finally that removes the socket


def _still_ours(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
