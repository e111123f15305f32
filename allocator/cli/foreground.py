"""Running ``allocator run``'s command in the foreground: its whole tree, signals, exit status.

Each child starts in a session of its own, so the signals a terminal sends
(Ctrl-C) reach ``run`` alone, and ``run`` forwards them to the command's
whole tree: every child's process group and every process below ``run``.
``run`` is a child subreaper, so what the command leaves behind (a
background child, a ``setsid`` child, a double fork) stays below it
whatever session it moves to; where the host lets ``run`` create a cgroup
(v2) below its own, the command runs in one
(``allocator/runs/run-<pid>-<hex>``), which holds the tree even once
``run`` is gone (the host's agent stops its members when the holding
ends). The GPUs are released only once nothing of the tree is left.

A stop (SIGTERM, SIGHUP, the command's end with processes left, a lost
hold) is SIGTERM to the tree, then SIGKILL after the grace (``grace=``);
Ctrl-C is passed on, and a second one kills outright. A signal that was
ignored when ``run`` started (``nohup``'s SIGHUP) stays ignored, for the
command too. Ctrl-Z stops the whole tree and then ``run``, and ``fg``
(SIGCONT) resumes both; while ``run`` is stopped a helper process keeps
its lease alive (``while_stopped``).

The exit status is the command's: a child killed by signal N makes it
128+N, as a shell reports it. With several children (``--per-gpu``), the
first one to fail stops the others, as torchrun does, and its status is
the run's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from allocator.errors import InvalidInput

__all__ = ["DEFAULT_GRACE", "FORWARDED", "Children", "exit_status"]

#: The signals ``run`` passes on to its command's tree (unless ignored when it started).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds from the SIGTERM that stops the command's tree to the SIGKILL.
DEFAULT_GRACE = 10.0
_POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1


def _run_cgroup() -> Path | None:
    """A fresh cgroup for the command, where the host allows one (None elsewhere)."""
    from allocator.agent.kernel.cgroups import (
        RUNS_SCOPE,
        create_worker_cgroup,
        worker_cgroup_base,
    )

    base, _ = worker_cgroup_base(scope=RUNS_SCOPE)
    if base is None:
        return None
    _remove_abandoned(base)
    return create_worker_cgroup(base, f"run-{os.getpid()}-{secrets.token_hex(3)}")


def _remove_abandoned(base: Path) -> None:
    """Remove the empty cgroups of runs that are gone (killed with no agent to tidy up).

    A cgroup still in use is never removed: the kernel refuses to remove
    one with members, and one whose run still lives is left alone.
    """
    from allocator.agent.kernel.cgroups import remove_cgroup

    with contextlib.suppress(OSError):
        for cgroup in base.glob("run-*-*"):
            pid = cgroup.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                remove_cgroup(cgroup)


def _in_child(cgroup: Path | None) -> Callable[[], None]:
    """What each child does before it execs the command: enter the cgroup, die with ``run``."""

    def prepare() -> None:
        if cgroup is not None:
            with contextlib.suppress(OSError):  # then the subreaper alone holds it
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        _die_with_parent()

    return prepare


def _die_with_parent() -> None:
    """In the child: be killed if ``run`` dies (SIGKILL).

    Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; it reaches this child only:
    what it starts is stopped by the host's agent once the lease expires
    (it carries the holding's identity).
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128+N for death by signal N (pure)."""
    return 128 - returncode if returncode < 0 else returncode


class Children:
    """The command's processes, one per environment, each in its own session, and their tree.

    ``while_stopped``: called before ``run`` stops itself (Ctrl-Z); what it
    returns is called when ``run`` continues.
    """

    def __init__(
        self,
        argv: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        *,
        grace: float = DEFAULT_GRACE,
        while_stopped: Callable[[], Callable[[], None]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        time_limit: float | None = None,
    ) -> None:
        self._argv = list(argv)
        self._envs = envs
        self._grace = grace
        self._while_stopped = while_stopped
        self._resume: Callable[[], None] | None = None
        self._continued = False  # a SIGCONT since the last Ctrl-Z
        self._monotonic = monotonic
        self._procs: list[subprocess.Popen[bytes]] = []
        self._interrupts = 0
        self._stopping_since: float | None = None
        self._cgroup: Path | None = None
        # The time limit counts from start(); None: the command may run for ever.
        self._time_limit = time_limit
        self._ends_at: float | None = None
        #: Whether the tree was stopped because its time limit came.
        self.timed_out = False

    def start(self) -> None:
        """Start one process per environment (each on top of this process's own)."""
        from allocator.agent.kernel.procs import become_subreaper

        become_subreaper()  # orphans of the command come to us, not to init
        self._cgroup = _run_cgroup()
        if self._time_limit is not None:
            self._ends_at = self._monotonic() + self._time_limit
        for env in self._envs:
            try:
                child = subprocess.Popen(
                    self._argv,
                    env={**os.environ, **env},
                    start_new_session=True,
                    preexec_fn=_in_child(self._cgroup),
                )
            except OSError as exc:
                self.signal(signal.SIGKILL)
                raise InvalidInput(f"cannot run {self._argv[0]!r}: {exc.strerror}") from exc
            self._procs.append(child)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every child's process group and every process below ``run``."""
        for child in self._procs:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signum)
        for pid in _below_us(self._ours()) + self._in_cgroup():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def _in_cgroup(self) -> list[int]:
        from allocator.agent.kernel.cgroups import cgroup_members

        return cgroup_members(self._cgroup) if self._cgroup is not None else []

    def close(self) -> None:
        """Remove the command's cgroup (once nothing is left in it)."""
        from allocator.agent.kernel.cgroups import remove_cgroup

        if self._cgroup is not None:
            remove_cgroup(self._cgroup)

    def stop(self) -> None:
        """Ask the whole tree to stop; SIGKILL follows after the grace (see :meth:`wait`)."""
        if self._stopping_since is None:
            self._stopping_since = self._monotonic()
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs

    def forward(self, signum: int, _frame: FrameType | None = None) -> None:
        """A signal handler: pass ``signum`` on.

        SIGTERM and SIGHUP stop the tree (SIGKILL after the grace); Ctrl-C is
        the user's to repeat (an interactive command may only cancel what it
        was doing), and a second one kills outright.
        """
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                self.signal(signal.SIGKILL)
                return
        elif self._stopping_since is None:
            self._stopping_since = self._monotonic()
        self.signal(signum)

    def wait(self) -> int:
        """Wait until nothing of the tree is left; the run's exit status (first failure, else 0)."""
        failed: int | None = None
        while True:
            running = False
            for child in self._procs:
                if child.returncode is None and child.poll() is None:
                    running = True
                elif child.returncode and failed is None:
                    failed = exit_status(child.returncode)
                    self.stop()  # one rank down: the rest cannot finish
            if not running and not self._left_behind():
                return failed or 0
            self._end_at_limit()
            self._escalate()
            self._wait_a_little()

    def _left_behind(self) -> bool:
        """Whether processes of the command are left once its children ended (they are stopped)."""
        ours = self._ours()
        left = [pid for pid in _below_us(ours) + self._in_cgroup() if pid not in ours]
        if left and self._stopping_since is None:
            self.stop()
        return bool(left)

    def _ours(self) -> set[int]:
        return {child.pid for child in self._procs}

    def _end_at_limit(self) -> None:
        """Stop the tree once its time limit has come (SIGKILL follows after the grace)."""
        if self._ends_at is not None and not self.timed_out and self._monotonic() >= self._ends_at:
            self.timed_out = True
            self.stop()

    def _escalate(self) -> None:
        since = self._stopping_since
        if since is not None and self._monotonic() - since >= self._grace:
            self.signal(signal.SIGKILL)

    def _wait_a_little(self) -> None:
        """Block until the first running child exits, or :data:`_POLL_SECONDS` pass."""
        first = next((child for child in self._procs if child.returncode is None), None)
        if first is None:
            time.sleep(_POLL_SECONDS)
            return
        if not _wait_for_exit(first.pid, _POLL_SECONDS):
            with contextlib.suppress(subprocess.TimeoutExpired):
                first.wait(_POLL_SECONDS)  # no pidfd here: subprocess's own (sleeping) poll

    def suspend(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        """Ctrl-Z: stop the whole tree, keep the hold alive, then stop ``run`` itself.

        A ``fg`` that comes while the keeper starts (its handler runs inside
        this one) leaves ``run`` running: stopping after it would be for ever.
        """
        self.signal(signal.SIGSTOP)
        self._continued = False
        if self._while_stopped is not None and self._resume is None:
            self._resume = self._while_stopped()
        if self._continued:
            self.resume()
            return
        os.kill(os.getpid(), signal.SIGSTOP)

    def resume(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        """``fg``/``bg`` (SIGCONT): ``run`` keeps its own lease again; the tree goes on."""
        self._continued = True
        if self._resume is not None:
            resume, self._resume = self._resume, None
            resume()
        self.signal(signal.SIGCONT)

    def install_forwarding(self) -> dict[int, object]:
        """Install ``run``'s signal handlers; the handlers they replaced.

        A signal ignored when ``run`` started stays ignored (``nohup``): the
        command inherits it ignored, as it would from a shell.
        """
        handlers: dict[int, Callable[[int, FrameType | None], None]] = {
            signum: self.forward for signum in FORWARDED
        }
        handlers[signal.SIGTSTP] = self.suspend
        handlers[signal.SIGCONT] = self.resume
        return {
            signum: signal.signal(signum, handler)
            for signum, handler in handlers.items()
            if signal.getsignal(signum) != signal.SIG_IGN
        }


def _wait_for_exit(pid: int, timeout: float) -> bool:
    """Block until ``pid`` exits or ``timeout`` passes; False where pidfds are not to be had.

    A pidfd wakes the moment the child ends; ``Popen.wait(timeout)`` sleeps
    in growing steps and overshoots a short command's end by milliseconds.
    """
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout * 1000)
    finally:
        os.close(fd)
    return True


def _below_us(kept: set[int]) -> list[int]:
    """Every live process below this one (as a subreaper, orphans too); their zombies reaped.

    ``kept``: our direct children, which ``subprocess`` reaps itself (reaping
    one here would lose its exit status).
    """
    found = _proc_descendants(os.getpid())
    if found is None:
        found = _psutil_descendants()
    alive: list[int] = []
    for pid, zombie in found:
        if zombie and pid not in kept:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        elif not zombie:
            alive.append(pid)
    return alive


def _proc_descendants(root: int) -> list[tuple[int, bool]] | None:
    """Each process below ``root`` and whether it is a zombie, from ``/proc``'s children lists.

    ``None`` where the kernel keeps no such lists (psutil then scans every
    process, which costs its import and a read of each one's stat).
    """
    found: list[tuple[int, bool]] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        children = _children_of(pid)
        if children is None:
            if pid == root:
                return None
            continue  # gone meanwhile
        for child in children:
            state = _state_of(child)
            if state is None:
                continue
            found.append((child, state == "Z"))
            todo.append(child)
    return found


def _children_of(pid: int) -> list[int] | None:
    """The children of every thread of ``pid`` (``/proc/PID/task/TID/children``)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    children: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as handle:
                children.extend(int(word) for word in handle.read().split())
        except FileNotFoundError:
            if pid == os.getpid():
                return None  # no children lists in this kernel
        except (OSError, ValueError):
            continue
    return children


def _state_of(pid: int) -> str | None:
    """The state letter of ``pid`` (R, S, Z...), or ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            raw = handle.read()
    except OSError:
        return None
    after = raw.rfind(")")  # the name may hold spaces and parentheses
    return raw[after + 2 : after + 3] or None


def _psutil_descendants() -> list[tuple[int, bool]]:
    """What :func:`_proc_descendants` finds, by psutil's scan of every process."""
    import psutil  # only without /proc's children lists: kept off the CLI's start-up

    try:
        below = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    found: list[tuple[int, bool]] = []
    for process in below:
        try:
            found.append((process.pid, process.status() == psutil.STATUS_ZOMBIE))
        except psutil.Error:
            continue  # gone meanwhile
    return found
