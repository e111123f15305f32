"""The worker shim: one small supervising process per worker (the containerd-shim pattern).

The agent runs ``python -I -S shim.py STATUS GRACE CGROUP RUNAS CWD ENVFD -- ARGV...``
in a new session for every worker, with an empty environment: the worker's
comes through the pipe ENVFD (``KEY=VALUE`` entries, NUL-separated; ``-``:
the shim's own), so nothing in it (``LD_PRELOAD``, ``LD_LIBRARY_PATH``) ever
reaches the shim, which may run as root for a worker that does not. After
the environment and one empty entry, the pipe may carry the shim's own
settings: ``cpus=0-3,8`` pins the worker to those CPUs. The shim

* makes itself a child subreaper, so every descendant of the worker stays
  below it whatever session or process group it moves to (torchrun starts
  its ranks with ``start_new_session=True``): while the shim lives, its
  descendants *are* the worker's process tree;
* joins the worker's cgroup first when the agent made one (CGROUP, ``-``: none);
* forks and execs the worker with the environment it was handed, on its
  CPUs (``sched_setaffinity``; a CPU set the kernel refuses is reported in
  the log and the worker runs unpinned), in CWD, as RUNAS (``uid:gid:g1,g2``,
  ``-``: as itself), with the parent-death signal set to SIGKILL so a shim
  killed outright takes its worker along;
* forwards signals: SIGTERM and SIGINT (a stop) to every descendant, any
  other (an ``on_change`` signal, SIGHUP) to the worker's main process;
* writes STATUS atomically (temporary file + rename) when it starts, when
  the worker runs, and when the worker's main process ends (its exit code,
  128+N for signal N), so an agent restarted in the meantime still learns
  the real exit status of a worker that is not its child;
* once the main process has ended, stops what is left of the tree (SIGTERM,
  then SIGKILL after GRACE); after a stop the agent escalates, and the shim
  does only if the agent that started it died (GRACE plus a margin after the
  stop); it reaps everything and exits with the worker's exit code. The
  shim's end therefore means the whole tree is gone.

Standard library only, and nothing from ``allocator``: it runs isolated
(``-I -S``) for the worker's whole life, so it must start fast and stay small
(it imports neither ``json`` nor ``re``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

_TYPE_CHECKING = False  # ``typing`` is an import the shim does without
TYPE_CHECKING = _TYPE_CHECKING
if TYPE_CHECKING:
    import socket

__all__ = [
    "HANDED",
    "IDLE",
    "NO_VALUE",
    "decode_handover",
    "encode_handover",
    "main",
    "parse_cpus",
    "parse_env",
    "parse_runas",
    "read_env",
]

#: Spelling of "not given" for the CGROUP, RUNAS and CWD arguments.
NO_VALUE = "-"
#: The first argument of a warm shim: ``IDLE SOCKET_FD STATE_DIR`` (see :func:`main`).
IDLE = "--idle"
#: ENVFD of a warm shim's hand-over: the environment came in the same frame.
HANDED = "+"
_FRAME_HEAD = 8

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_EXIT_NOT_FOUND = 127
_EXIT_CANNOT_RUN = 126
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


_LIBC: list[ctypes.CDLL] = []


def _prctl(option: int, value: int) -> bool:
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


def _start_ticks(pid: int) -> int | None:
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


class _Status:
    """The status file: rewritten whole (temporary file + rename) on every change."""

    def __init__(self, path: str) -> None:
        self.path = path
        me = os.getpid()
        self.fields: dict[str, object] = {"shim_pid": me, "shim_start_ticks": _start_ticks(me)}

    def write(self, **changes: object) -> None:
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
            _say(f"cannot write status file {self.path}: {exc.strerror or exc}")


def _say(message: str) -> None:
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
        _say(f"cannot pin the worker to CPUs {sorted(cpus)}: {exc.strerror or exc}")


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
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
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


def _launch(
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


class _Supervision:
    """The shim's loop: forward signals, reap, stop what is left, exit with the worker's code."""

    def __init__(self, worker: int, grace: float, status: _Status, agent: int) -> None:
        self.worker = worker
        self.grace = grace
        self.status = status
        self.agent = agent
        self.code: int | None = None
        self.stopping = False
        self.deadline: float | None = None
        self.backstop = False  # the deadline is the agent's to act on while it lives
        self.killing = False

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
        if signum in _STOP_SIGNALS:
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


def _arguments(argv: list[str]) -> tuple[str, float, str, str, str, str, list[str]]:
    status, grace, cgroup, runas, cwd, env_fd, separator, *command = argv
    if separator != "--" or not command:
        raise ValueError("expected STATUS GRACE CGROUP RUNAS CWD ENVFD -- COMMAND...")
    return status, float(grace), cgroup, runas, cwd, env_fd, command


def read_env(fd: int) -> tuple[dict[str, str], dict[str, str]]:
    """The worker's environment and the shim's settings from pipe ``fd``.

    ``KEY=VALUE`` entries separated by NULs; an empty entry ends the
    environment, and the entries after it are settings (``cpus=0-3``).
    """
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return parse_env(b"".join(chunks))


def parse_env(payload: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """The environment and the settings of a payload (see :func:`read_env`)."""
    env: dict[str, str] = {}
    settings: dict[str, str] = {}
    into = env
    for entry in payload.split(b"\0"):
        key, equals, value = entry.partition(b"=")
        if not entry:
            into = settings
        elif key and equals:
            into[os.fsdecode(key)] = os.fsdecode(value)
    return env, settings


def main(argv: list[str]) -> int:
    """Run the worker ``argv`` describes (see the module docstring); return its exit code."""
    if argv[:1] == [IDLE]:
        return _idle(argv[1:])
    return _run(argv)


def _run(argv: list[str], handed: bytes | None = None) -> int:
    agent = os.getppid()  # the agent that started this shim
    try:
        status_path, grace, cgroup, runas_text, cwd, env_fd, command = _arguments(argv)
        runas = parse_runas(runas_text)
        if handed is not None:
            env, settings = parse_env(handed)
        elif env_fd == NO_VALUE:
            env, settings = dict(os.environ), {}
        else:
            env, settings = read_env(int(env_fd))
        cpus = parse_cpus(settings["cpus"]) if settings.get("cpus") else None
    except (ValueError, OSError) as exc:
        _say(f"bad arguments: {exc}")
        return 2
    waited = set(signal.valid_signals()) - _NOT_FORWARDED | {signal.SIGCHLD}
    # Blocked from the start: a stop that comes while the worker is being
    # started waits for it, and SIGCHLD is taken in the loop, never lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        _say("cannot become a child subreaper; processes that leave the worker may escape")
    if cgroup != NO_VALUE:
        _join_cgroup(cgroup)
    status = _Status(status_path)
    status.write(state="starting")
    pid, code, error = _launch(command, env, None if cwd == NO_VALUE else cwd, runas, cpus)
    if error:
        os.waitpid(pid, 0)
        _say(error)
        status.write(state="failed", exit_code=code, error=error)
        return code
    status.write(state="running", pid=pid, start_ticks=_start_ticks(pid))
    return _Supervision(pid, grace, status, agent).run(waited)


def _idle(argv: list[str]) -> int:
    """A warm shim: wait on socket ``argv[0]`` for a worker, then run it as a cold shim would.

    The agent sends one frame (its length, then the shim's arguments and the
    worker's environment, see :func:`encode_handover`) with the worker's log
    attached. End of file before a whole frame means the agent is gone (or
    closed this shim): exit, having started nothing.
    """
    import socket  # only a warm shim needs it, and it imports it while idle

    _prctl(_PR_SET_CHILD_SUBREAPER, 0)  # resolve libc now, not when a worker waits
    with socket.socket(fileno=int(argv[0])) as sock:
        frame, log = _receive(sock)
    if frame is None or log is None:
        return 0
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        args, payload = decode_handover(frame)
    except ValueError as exc:
        _say(f"bad hand-over: {exc}")
        return 2
    return _run(args, payload)


def _receive(sock: socket.socket) -> tuple[bytes | None, int | None]:
    """One frame and the descriptor that came with it; (None, None) at end of file."""
    import socket  # imported already by :func:`_idle`

    try:
        head, fds, _flags, _addr = socket.recv_fds(sock, _FRAME_HEAD, 1)
    except OSError:
        return None, None
    log = fds[0] if fds else None
    data = bytearray(head)
    while len(data) < _FRAME_HEAD or len(data) < _FRAME_HEAD + _frame_length(data):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    if len(data) < _FRAME_HEAD or len(data) != _FRAME_HEAD + _frame_length(data):
        if log is not None:
            os.close(log)
        return None, None
    return bytes(data[_FRAME_HEAD:]), log


def _frame_length(data: bytes | bytearray) -> int:
    return int.from_bytes(data[:_FRAME_HEAD], "big")


def encode_handover(args: list[str], payload: bytes) -> bytes:
    """The frame a warm shim is handed: length, argument count, arguments, environment."""
    body = b"\0".join([str(len(args)).encode(), *(os.fsencode(a) for a in args), payload])
    return len(body).to_bytes(_FRAME_HEAD, "big") + body


def decode_handover(body: bytes) -> tuple[list[str], bytes]:
    """The arguments and the environment payload of a frame's body (``ValueError`` if bad)."""
    count_text, _, rest = body.partition(b"\0")
    count = int(count_text)
    parts = rest.split(b"\0", count)
    if count < 0 or len(parts) != count + 1:
        raise ValueError("truncated arguments")
    return [os.fsdecode(part) for part in parts[:count]], parts[count]


def _join_cgroup(path: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    except OSError as exc:
        _say(f"cannot join cgroup {path}: {exc.strerror or exc}")


if __name__ == "__main__":
    # Nothing is buffered (every write is ``os.write``): skip the interpreter's
    # teardown, so that the shim's end, which the agent waits for, comes at once.
    os._exit(main(sys.argv[1:]))
