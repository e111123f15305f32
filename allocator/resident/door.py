"""The ``allocator`` console script: through the user's command server, or in this process.

The command runs exactly once: in the server's worker, only after this client
said go (``G``), or here, when no server answered, it declined, or it was too
slow to accept. A worker that ends without an exit status after go is an
internal error (exit 1), never a second run. Signals this client receives
(Ctrl-C, SIGTERM, Ctrl-Z and ``fg``) go on to the worker, and those it was
started ignoring (``nohup``) stay ignored there too; a client killed
outright takes its worker's command with it (the worker sees the connection
close).
"""

from __future__ import annotations

# The C halves of socket and signal: their Python halves import enum and
# selectors, milliseconds on every command, for nothing the door uses.
import _socket
import os
import sys

from allocator.resident import wire
from allocator.util.command_words import command_word

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable
else:
    import _signal as signal

__all__ = ["main", "run", "served"]

#: How long the server may take to accept a request before this client runs it itself.
ACCEPT_SECONDS = 5.0
#: The signals a client passes on to its worker (it stays alive to relay the exit status).
RELAYED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def run() -> None:
    """Console-script entry point."""
    code = served()
    if code is not None:
        # Nothing in this process needs tearing down: skip the interpreter's own
        # (a millisecond or two of every served command).
        for stream in (sys.stdout, sys.stderr):
            try:  # noqa: SIM105 (contextlib would cost this client its import)
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(_run_here())


def main() -> int:
    """Run ``sys.argv``'s command through the server when one serves it, else here."""
    code = served()
    return code if code is not None else _run_here()


def served() -> int | None:
    """The exit status of ``sys.argv``'s command run by the server; ``None``: run it here."""
    if not wire.enabled(os.environ) or command_word(sys.argv[1:]) not in wire.SERVED:
        return None
    path = wire.socket_path(os.environ, os.path.dirname(os.path.dirname(wire.__file__)))
    return None if path is None else _through_server(path, sys.argv[1:])


def _run_here() -> int:
    from allocator.cli import main as run_here

    return run_here()


def _through_server(path: str, argv: list[str]) -> int | None:
    """The exit status of the command run by the server; ``None``: run it here."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            connection.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            _start_server(path)
            return None
        except OSError:
            return None
        ignored = [n for n in wire.INHERITED_IGNORED if signal.getsignal(n) == signal.SIG_IGN]
        relay = _Relay(connection, ignored)
        try:
            worker = _accepted(connection, argv, ignored)
            if worker is None:
                return None
            relay.worker = worker
            if relay.received:  # interrupted before it began: it never runs anywhere
                return relay.die_of(relay.received[-1])
            connection.sendall(wire.GO)
            relay.live = True
            return relay.exit_status()
        except OSError:
            return None if not relay.live else relay.lost()
        finally:
            relay.restore()
    finally:
        connection.close()


def _accepted(connection: _socket.socket, argv: list[str], ignored: list[int]) -> int | None:
    """Send the request; the worker's pid once the server accepted it (ready to run on go)."""
    import array

    request = wire.encode_request(argv, ignored)
    connection.settimeout(ACCEPT_SECONDS)
    stdio = (_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))
    sent = connection.sendmsg([request[:4096]], [stdio])
    connection.sendall(request[sent:])
    answer = connection.recv(5)
    while answer[:1] == wire.ACCEPTED and len(answer) < 5:
        chunk = connection.recv(5 - len(answer))
        if not chunk:
            return None
        answer += chunk
    if answer[:1] != wire.ACCEPTED:
        return None
    connection.settimeout(None)
    return int.from_bytes(answer[1:5], "big")


class _Relay:
    """Signals this client receives: kept until go, then passed on to the worker.

    One this client was started ignoring is left ignored: the worker ignores
    it too (the request says so), as a command run here would.
    """

    def __init__(self, connection: _socket.socket, ignored: list[int]) -> None:
        self.connection = connection
        self.received: list[int] = []
        self.live = False
        self.worker: int | None = None
        self.previous = {}
        handlers: dict[int, Callable[[int, object], None]] = {
            getattr(signal, name): self._caught for name in RELAYED
        }
        handlers[signal.SIGTSTP] = self._suspend
        handlers[signal.SIGCONT] = self._resume
        for number, handler in handlers.items():
            if number not in ignored:
                self.previous[number] = signal.signal(number, handler)

    def _suspend(self, _signum: int, _frame: object) -> None:
        """Ctrl-Z: the worker stops as the command would here (``run``: its tree first), then this.

        The worker gets SIGTSTP and stops itself; a lookout started here
        continues it should this client die while it is stopped (the
        worker's own thread that would notice is stopped with it). This
        client stops with SIGSTOP, not SIGTSTP's default, which is discarded
        in an orphaned process group.
        """
        if self.live and self.worker is not None:
            _start_lookout(self.worker)
        self._to_worker(signal.SIGTSTP)
        os.kill(os.getpid(), signal.SIGSTOP)

    def _resume(self, _signum: int, _frame: object) -> None:
        """``fg``/``bg``: the worker goes on with this client."""
        self._to_worker(signal.SIGCONT)

    def _to_worker(self, signum: int) -> None:
        """Send ``signum`` to the worker's process itself, once it runs the command."""
        if self.live and self.worker is not None:
            try:  # noqa: SIM105 (contextlib would cost this client its import)
                os.kill(self.worker, signum)
            except OSError:
                pass

    def _caught(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        if self.live:
            try:  # noqa: SIM105 (contextlib would cost this client its import)
                self.connection.sendall(wire.SIGNAL + bytes([signum]))
            except OSError:
                pass

    def exit_status(self) -> int:
        """Wait for the worker's exit status."""
        answer = b""
        while True:
            chunk = self.connection.recv(16)
            if not chunk:
                return self.lost()
            answer += chunk
            if answer[:1] == wire.EXITED and len(answer) >= 5:
                return int.from_bytes(answer[1:5], "big", signed=True)

    def lost(self) -> int:
        """The worker ended without an exit status (after go: never run it again here)."""
        if self.received:  # it died of the signal this client was sent: so does this client
            return self.die_of(self.received[-1])
        sys.stderr.write(
            "allocator: internal error: the command server's worker ended without an exit "
            "status (ALLOCATOR_SERVER=0 runs commands in this process)\n"
        )
        return 1

    def die_of(self, signum: int) -> int:
        """End as a command run here ends on ``signum``: Ctrl-C exits 130, others kill."""
        self.restore()
        if signum == signal.SIGINT:
            sys.stderr.write("allocator: error: interrupted\n")
            return 130
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}


def _start_lookout(worker: int) -> None:
    """Start :mod:`allocator.resident.stopped` for ``worker`` and this client, detached."""
    # No lookout where it cannot start: a client killed while stopped then
    # leaves its worker stopped.
    _spawn_detached("allocator.resident.stopped", [str(worker), str(os.getpid())], _python_env())


def _start_server(path: str) -> None:
    """Start a server for the next command, detached: its own session, no stdio of ours.

    Not when one was started in the last minute (its lock file says when): it
    is still loading, or it cannot serve here, and each start costs a second
    of CPU.
    """
    import time

    try:
        started = os.stat(path + ".lock").st_mtime
    except OSError:
        started = 0.0
    if time.time() - started < wire.START_BACKOFF_SECONDS:
        return
    try:  # this start's time, whether or not the server gets as far as writing its pid
        marker = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
        os.utime(marker)
        os.close(marker)
    except OSError:
        return
    environ = _python_env()
    idle = os.environ.get("ALLOCATOR_SERVER_IDLE")
    if idle is not None:
        environ["ALLOCATOR_SERVER_IDLE"] = idle
    # No server where it cannot start: every command runs in its own process, as before.
    _spawn_detached("allocator.resident.server", [path], environ)


def _python_env() -> dict[str, str]:
    """What of this client's environment a helper it starts needs: Python's, the locale's."""
    keep = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HOME", "LANG", "TZ")
    return {k: v for k, v in os.environ.items() if k in keep or k.startswith(("LC_", "XDG_"))}


def _spawn_detached(module: str, words: list[str], environ: dict[str, str]) -> None:
    """Start ``python -m module words``: its own session, /dev/null for stdio; never raises."""
    null = os.devnull
    try:  # noqa: SIM105 (contextlib would cost this client its import)
        os.posix_spawn(
            sys.executable,
            # -P: not the working directory first on sys.path, so it loads the
            # package this client did, whatever directory it was started from.
            [sys.executable, "-P", "-m", module, *words],
            environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, null, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, null, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, null, os.O_WRONLY, 0),
            ],
            setsid=True,
        )
    except OSError:
        pass


if __name__ == "__main__":
    run()
