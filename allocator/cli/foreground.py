"""Running ``allocator run``'s command in the foreground: children, signals, exit status.

Each child starts in a session of its own, so the signals a terminal sends
(Ctrl-C) reach ``run`` alone, and ``run`` forwards them to every child's
whole process group: what a worker forked gets them too. A second Ctrl-C
kills the groups outright. The exit status is the command's: a child killed
by signal N makes it 128+N, as a shell reports it. With several children
(``--per-gpu``), the first one to fail stops the others (SIGTERM), as
torchrun does, and its status is the run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from types import FrameType

from allocator.errors import InvalidInput

__all__ = ["FORWARDED", "Children", "exit_status"]

#: The signals ``run`` passes on to its command's process groups.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: be killed if ``run`` dies (SIGKILL), so no command outlives its GPUs.

    Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; elsewhere nothing (the lease still
    frees the GPUs, and the command is left running).
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for death by signal N (pure)."""
    return 128 - returncode if returncode < 0 else returncode


class Children:
    """The command's processes, one per environment, each in its own session."""

    def __init__(self, argv: Sequence[str], envs: Sequence[Mapping[str, str]]) -> None:
        self._argv = list(argv)
        self._envs = envs
        self._procs: list[subprocess.Popen[bytes]] = []
        self._interrupts = 0

    def start(self) -> None:
        """Start one process per environment (each on top of this process's own)."""
        for env in self._envs:
            try:
                child = subprocess.Popen(
                    self._argv,
                    env={**os.environ, **env},
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                self.signal(signal.SIGKILL)
                raise InvalidInput(f"cannot run {self._argv[0]!r}: {exc.strerror}") from exc
            self._procs.append(child)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every child's process group that may still be there."""
        for child in self._procs:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signum)

    def forward(self, signum: int, _frame: FrameType | None = None) -> None:
        """A signal handler: pass ``signum`` on; a second Ctrl-C kills outright."""
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                signum = signal.SIGKILL
        self.signal(signum)

    def wait(self) -> int:
        """Wait for every child; the run's exit status (the first failure's, else 0)."""
        failed: int | None = None
        while True:
            running = False
            for child in self._procs:
                if child.returncode is None and child.poll() is None:
                    running = True
                elif child.returncode and failed is None:
                    failed = exit_status(child.returncode)
                    self.signal(signal.SIGTERM)  # one rank down: the rest cannot finish
            if not running:
                return failed or 0
            self._wait_a_little()

    def _wait_a_little(self) -> None:
        """Block until the first running child exits, or :data:`_POLL_SECONDS` pass."""
        first = next(child for child in self._procs if child.returncode is None)
        with contextlib.suppress(subprocess.TimeoutExpired):
            first.wait(_POLL_SECONDS)

    def install_forwarding(self) -> dict[int, object]:
        """Forward :data:`FORWARDED` signals to the children; the handlers they replaced."""
        return {signum: signal.signal(signum, self.forward) for signum in FORWARDED}
