"""A warm shim: one worker shim started ahead of time, idle until a worker must start.

Starting a worker costs a Python interpreter for its shim before the
worker's own ``exec``. Like multiprocessing's forkserver, the agent keeps
one shim already started (``python -I -S shim/main.py --idle FD STATE_DIR``),
blocked on a socket, and hands it the next worker to start: its arguments,
its environment and its log (passed as a descriptor). From then on it is
exactly the shim a cold start makes (same session, status file, cgroup,
user, CPUs), so adoption, stops and exit statuses do not know the
difference. A new idle shim is started a little later, off the path of the
worker that was just started.

An idle shim holds nothing of a job: it starts with the agent's bare
``PATH``/``LD_LIBRARY_PATH`` (no job's variables, no secrets), opens no
GPU, joins no worker cgroup, writes no status file. It ends as soon as
its socket reaches end of file: when the agent closes it on shutdown, and
when the agent dies, ``kill -9`` included (the kernel closes the agent's end).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from allocator.agent.kernel import procs
from allocator.agent.processes.pause_points import pause_point
from allocator.agent.shim.main import IDLE, encode_handover

__all__ = ["REFILL_SECONDS", "IdleShim", "WarmShims"]

#: After a warm shim is used, how long until the next one starts: its
#: interpreter start must not compete with the worker that was just started.
REFILL_SECONDS = 0.0
#: How long an orderly shutdown waits for an idle shim to end once told.
_CLOSE_WAIT_SECONDS = 2.0


@dataclass(slots=True)
class IdleShim:
    """A started shim waiting on ``sock`` for a worker."""

    popen: subprocess.Popen[bytes]
    sock: socket.socket
    start_ticks: int | None

    @property
    def pid(self) -> int:
        """The shim's process id."""
        return self.popen.pid

    def hand_over(self, args: list[str], payload: bytes, log_fd: int) -> bool:
        """Send the shim its worker (``log_fd`` becomes its stdout and stderr).

        False when the shim cannot take it (it died): start a cold one instead.
        """
        frame = encode_handover(args, payload)
        half = max(len(frame) // 2, 8)
        try:
            sent = socket.send_fds(self.sock, [frame[:8]], [log_fd])
            self.sock.sendall(frame[sent:half])
            pause_point("handover")  # tests: the agent killed in the middle of it
            self.sock.sendall(frame[half:])
        except OSError:
            return False
        finally:
            self.sock.close()
        return True

    def close(self, wait: float = 0.0) -> None:
        """End of file for the shim, which then exits; reap it within ``wait`` seconds."""
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(wait) if wait > 0 else self.popen.poll()


class WarmShims:
    """Keeps one idle shim ready for the next worker start (see the module docstring)."""

    def __init__(
        self,
        shim: Path,
        state_dir: Path,
        shim_env: Callable[[], dict[str, str]],
        *,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self._shim = shim
        self._state_dir = state_dir
        self._shim_env = shim_env
        self._clock = clock
        self.enabled = enabled
        self.idle: IdleShim | None = None
        self.refill_at: float | None = clock() if enabled else None
        self.died = 0  # idle shims found dead when one was wanted

    def take(self) -> IdleShim | None:
        """The idle shim, now the caller's; None when there is none alive."""
        idle, self.idle = self.idle, None
        self._due_in(REFILL_SECONDS)
        if idle is not None and idle.popen.poll() is not None:  # it died idle: start cold
            self.died += 1
            idle.close()
            return None
        return idle

    def due(self) -> float | None:
        """When :meth:`tick` next has something to do (None: nothing planned)."""
        return self.refill_at

    def tick(self) -> None:
        """Start an idle shim if one is due; replace one that died idle."""
        if self.idle is not None and self.idle.popen.poll() is not None:
            self.died += 1
            self.idle.close()
            self.idle = None
            self._due_in(0.0)
        if self.refill_at is None or self._clock() < self.refill_at:
            return
        self.refill_at = None
        if self.enabled and self.idle is None:
            self.idle = self._start()

    def close(self) -> None:
        """Let the idle shim go (it exits at end of file) and start no other."""
        self.enabled, self.refill_at = False, None
        idle, self.idle = self.idle, None
        if idle is not None:
            idle.close(_CLOSE_WAIT_SECONDS)

    def _due_in(self, seconds: float) -> None:
        if self.enabled:
            at = self._clock() + seconds
            self.refill_at = at if self.refill_at is None else min(self.refill_at, at)

    def _start(self) -> IdleShim | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [
            sys.executable or "python3",
            "-I",
            "-S",
            str(self._shim),
            IDLE,
            str(theirs.fileno()),
            str(self._state_dir),
        ]
        try:
            popen = subprocess.Popen(
                command,
                env=self._shim_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        except (OSError, subprocess.SubprocessError):
            ours.close()
            return None  # workers start cold; the next use tries again
        finally:
            theirs.close()
        started = procs.read_stat(popen.pid)
        return IdleShim(popen, ours, started.start_ticks if started else None)
