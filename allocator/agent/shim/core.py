"""The shim's work once it has its worker: start it, watch its tree, report how it ended.

Imported by :mod:`allocator.agent.shim.main` (see it for what the shim does and
guarantees). Standard library only, and nothing from ``allocator``: it runs
in the shim's isolated interpreter (``-I -S``) for the worker's whole life.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

__all__ = [
    "EXIT_HANDOVER",
    "EXIT_NO_STATUS",
    "NO_VALUE",
    "PR_SET_CHILD_SUBREAPER",
    "WAITED",
    "Status",
    "Supervision",
    "join_cgroup",
    "launch",
    "parse_cpus",
    "parse_runas",
    "prctl",
    "say",
    "start_ticks",
]

#: Spelling of "not given" for the CGROUP, RUNAS and CWD arguments.
NO_VALUE = "-"
_PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_EXIT_NOT_FOUND = 127
_EXIT_CANNOT_RUN = 126
#: The shim started nothing: its status file could not be written (a full disk).
EXIT_NO_STATUS = 121
#: The shim started nothing: it got less than a whole hand-over (its agent died).
EXIT_HANDOVER = 122
#: After a stop, the agent escalates to SIGKILL itself when the grace it chose
#: is over. Only once the agent that started the shim is gone does the shim do
#: it, this long after its own grace.
_BACKSTOP_SECONDS = 2.0
_AGENT_CHECK_SECONDS = 1.0
_KILL_PASS_SECONDS = 0.05
#: Signals that must never be waited for: they cannot be caught, report the
#: shim's own faults, or (SIGCHLD) are handled apart.
_NOT_FORWARDED = {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGCHLD,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
    signal.SIGPIPE,
}
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
#: What the shim waits for (every signal it forwards, and SIGCHLD): blocked from its start.
WAITED = set(signal.valid_signals()) - _NOT_FORWARDED | {signal.SIGCHLD}


_LIBC: list[ctypes.CDLL] = []


def prctl(option: int, value: int) -> bool:
    """``prctl(2)`` through libc (no psutil here: the shim starts bare); whether it worked."""
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        return int(_LIBC[0].prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _execvpe(argv: list[str], env: dict[str, str]) -> None:
    """``os.execvpe`` without its lazy imports: the child may no longer read the stdlib."""
    command = argv[0]
    if "/" in command:
        os.execve(command, argv, env)
    error: OSError = FileNotFoundError(2, "No such file or directory", command)
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory or ".", command), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:  # found but not runnable: remember, keep looking (as execvp does)
            error = exc
    raise error


def start_ticks(pid: int) -> int | None:
    """``pid``'s start time in clock ticks (``/proc/PID/stat`` field 22), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def _json(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    escaped = "".join(
        ch if ch.isprintable() and ch not in '"\\' else f"\\u{ord(ch):04x}" for ch in text
    )
    return f'"{escaped}"'


class Status:
    """The status file: rewritten whole (temporary file + rename) on every change."""

    def __init__(self, path: str, extra: dict[str, str] | None = None) -> None:
        self.path = path
        me = os.getpid()
        self.fields: dict[str, object] = {"shim_pid": me, "shim_start_ticks": start_ticks(me)}
        self.fields.update(extra or {})

    def write(self, **changes: object) -> bool:
        """Rewrite the file with ``changes``; False (and a line in the log) if it cannot."""
        self.fields.update(changes)
        body = "{" + ", ".join(f'"{k}": {_json(v)}' for k, v in self.fields.items()) + "}\n"
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, body.encode())
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:  # the agent falls back on the shim's own exit status
            say(f"cannot write status file {self.path}: {exc.strerror or exc}")
            try:  # noqa: SIM105 - contextlib is an import the shim does without
                os.unlink(tmp)  # a full disk keeps no half-written file
            except OSError:
                pass
            return False
        return True


def say(message: str) -> None:
    """One line on stderr, which is the worker's log."""
    os.write(2, f"allocator-shim: {message}\n".encode(errors="replace"))


def parse_runas(text: str) -> tuple[int, int, list[int]] | None:
    """``uid:gid:g1,g2`` as numbers; None for ``-`` (run as the shim's own user)."""
    if text == NO_VALUE:
        return None
    uid, gid, groups = text.split(":")
    return int(uid), int(gid), [int(g) for g in groups.split(",") if g]


def parse_cpus(text: str) -> set[int]:
    """The CPUs of a CPU list (``0-3,8``); ``ValueError`` if it is not one."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def _pin(cpus: set[int] | None) -> None:
    """Run on ``cpus`` (inherited by everything the worker starts); say so if the kernel refuses."""
    if cpus is None:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # CPUs outside this cgroup's cpuset, say: run, unpinned
        say(f"cannot pin the worker to CPUs {sorted(cpus)}: {exc.strerror or exc}")


def _exec_worker(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    runas: tuple[int, int, list[int]] | None,
    shim: int,
    cpus: set[int] | None = None,
) -> None:
    """In the forked child: become the worker. Never returns; raises on failure."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a worker must not
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    _pin(cpus)
    if runas is not None:
        uid, gid, groups = runas
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    # Set after the user switch, which clears it; then make sure the shim did
    # not die before it was set.
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != shim:
        os._exit(128 + signal.SIGKILL)
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError as exc:
            raise _StartError(
                _EXIT_CANNOT_RUN, f"cannot use working directory {cwd!r}: {exc.strerror}"
            ) from exc
    try:
        _execvpe(argv, env)
    except FileNotFoundError as exc:
        raise _StartError(_EXIT_NOT_FOUND, f"command not found: {argv[0]!r}") from exc
    except OSError as exc:
        raise _StartError(_EXIT_CANNOT_RUN, f"cannot run {argv[0]!r}: {exc.strerror}") from exc


class _StartError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def launch(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    runas: tuple[int, int, list[int]] | None,
    cpus: set[int] | None = None,
) -> tuple[int, int, str]:
    """Fork and exec the worker: (pid, 0, "") or (pid, exit code, why it could not start)."""
    read_end, write_end = os.pipe()  # both close on exec: EOF means the exec succeeded
    shim = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _exec_worker(argv, env, cwd, runas, shim, cpus)
        except _StartError as exc:
            os.write(write_end, f"{exc.code} {exc}".encode(errors="replace"))
        except OSError as exc:
            who = "cannot switch to the job's user" if runas else f"cannot run {argv[0]!r}"
            os.write(write_end, f"{_EXIT_CANNOT_RUN} {who}: {exc.strerror or exc}".encode())
        except BaseException as exc:  # the child must never go on to run the shim's code
            os.write(write_end, f"{_EXIT_CANNOT_RUN} cannot start: {exc}".encode(errors="replace"))
        os._exit(_EXIT_CANNOT_RUN)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    if not chunks:
        return pid, 0, ""
    code, _, message = b"".join(chunks).decode(errors="replace").partition(" ")
    return pid, int(code), message


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (children first), from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue  # it just ended
        parent = int(raw[raw.rindex(b")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _signal_tree(signum: int, first: int | None = None) -> None:
    """``signum`` once to every descendant; to ``first`` (the worker) before the scan of /proc."""
    if first is not None:
        _kill(first, signum)
    for pid in _descendants(os.getpid()):
        if pid != first:
            _kill(pid, signum)


def _kill(pid: int, signum: int) -> None:
    try:  # noqa: SIM105 - contextlib is an import the shim does without
        os.kill(pid, signum)
    except OSError:
        pass  # already gone


class Supervision:
    """The shim's loop: forward signals, reap, stop what is left, exit with the worker's code."""

    def __init__(self, worker: int, grace: float, status: Status, agent: int) -> None:
        self.worker = worker
        self.grace = grace
        self.status = status
        self.agent = agent
        self.code: int | None = None
        self.stopping = False
        self.deadline: float | None = None
        self.backstop = False  # the deadline is the agent's to act on while it lives
        self.killing = False
        # A command to run on a stop instead of signalling the tree (a container's
        # engine stops it), with its environment.
        self.stop_command: tuple[list[str], dict[str, str]] | None = None

    def run(self, waited: set[signal.Signals]) -> int:
        while True:
            info = signal.sigtimedwait(waited, self._timeout())
            if info is not None and info.si_signo != signal.SIGCHLD:
                self._forward(info.si_signo)
            if self._reap() and self.code is not None:
                return self.code
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self._deadline_reached()
            if self.killing:
                _signal_tree(signal.SIGKILL)

    def _deadline_reached(self) -> None:
        if self.backstop and os.getppid() == self.agent:
            # The agent that ordered the stop lives: it escalates when its grace
            # (which may be longer than the one the shim was started with) is over.
            self.deadline = time.monotonic() + _AGENT_CHECK_SECONDS
            return
        self.killing = True

    def _timeout(self) -> float:
        if self.killing:
            return _KILL_PASS_SECONDS
        if self.deadline is None:
            return 3600.0
        return max(0.0, self.deadline - time.monotonic())

    def _forward(self, signum: int) -> None:
        if signum in _STOP_SIGNALS and self.stop_command is not None and self.code is None:
            if not self.stopping:
                _spawn_stop(*self.stop_command)
                self.stopping, self.backstop = True, True
                self._due(self.grace + _BACKSTOP_SECONDS)
        elif signum in _STOP_SIGNALS:
            _signal_tree(signum, None if self.code is not None else self.worker)
            if not self.stopping:
                self.stopping, self.backstop = True, True
                self._due(self.grace + _BACKSTOP_SECONDS)
        elif self.code is None:
            try:  # noqa: SIM105 - contextlib is an import the shim does without
                os.kill(self.worker, signum)
            except OSError:
                pass  # it has just ended

    def _due(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        if self.deadline is None or deadline < self.deadline:
            self.deadline = deadline

    def _reap(self) -> bool:
        """Reap every exited child; True once no child is left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False
            if pid == self.worker:
                self._worker_ended(os.waitstatus_to_exitcode(status))

    def _worker_ended(self, code: int) -> None:
        self.code = 128 - code if code < 0 else code
        self.status.write(state="exited", exit_code=self.code)
        if not self.stopping:  # what it leaves behind goes too, as when it is stopped
            self.stopping = True  # and the shim sees to it itself: no agent orders this
            _signal_tree(signal.SIGTERM)
            self._due(self.grace)


def _spawn_stop(argv: list[str], env: dict[str, str]) -> None:
    """Start ``argv`` (the engine's stop) as a child; its output, but errors, is dropped."""
    quiet = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
    try:
        os.posix_spawn(argv[0], argv, env, file_actions=quiet)
    except OSError as exc:
        say(f"cannot run {argv[0]} to stop the container: {exc.strerror or exc}")


def join_cgroup(path: str) -> None:
    """Move this process into the cgroup at ``path``; a refusal is said, not fatal."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    except OSError as exc:
        say(f"cannot join cgroup {path}: {exc.strerror or exc}")
