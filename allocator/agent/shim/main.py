"""The worker shim: one small supervising process per worker (the containerd-shim pattern).

The agent runs ``python -I -S shim/main.py STATUS GRACE CGROUP RUNAS CWD ENVFD -- ARGV...``
in a new session for every worker, with an empty environment: the worker's
comes through the pipe ENVFD (``KEY=VALUE`` entries, NUL-separated; ``-``:
the shim's own), so nothing in it (``LD_PRELOAD``, ``LD_LIBRARY_PATH``) ever
reaches the shim, which may run as root for a worker that does not. After
the environment and one empty entry, the pipe may carry the shim's own
settings: ``cpus=0-3,8`` pins the worker to those CPUs, ``stop=WORD\x1fWORD...``
is a command the shim runs on a stop instead of signalling the tree (a
container's ``ENGINE stop -t GRACE NAME``), ``status.NAME=VALUE``
adds a field to the status file (the agent's job, worker index, spec
fingerprint, GPUs and boot id, so that a later agent can adopt the worker
from the status file alone). The pipe carries one *frame*: the payload's
length (8 bytes), the payload, then an end marker (see :func:`frame`). A
shim that gets less than a whole frame (the agent died handing it over)
starts nothing and exits with :data:`EXIT_HANDOVER`. The shim

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
* writes STATUS atomically (temporary file + rename) when it starts (and
  if it cannot, starts nothing and exits with :data:`EXIT_NO_STATUS`: a
  worker nobody can find again must not run), when the worker runs, and
  when the worker's main process ends (its exit code, 128+N for signal
  N), so an agent restarted in the meantime still learns the real exit
  status of a worker that is not its child;
* once the main process has ended, stops what is left of the tree (SIGTERM,
  then SIGKILL after GRACE); after a stop the agent escalates, and the shim
  does only if the agent that started it died (GRACE plus a margin after the
  stop); it reaps everything and exits with the worker's exit code. The
  shim's end therefore means the whole tree is gone.

A *warm* shim (``python -I -S shim/main.py --idle SOCKET_FD STATE_DIR``, see
:mod:`allocator.agent.processes.warm_shim`) is started before it has a worker: with the
agent's bare ``PATH`` and nothing of a job, it waits on a socket for one
frame holding these same arguments and the environment (ENVFD ``+``), with
the worker's log attached as a descriptor; then it does all of the above.
End of file first (the agent closed it, or died) ends it, having started
nothing.

Standard library only: it runs isolated (``-I -S``) for the worker's whole
life, so it must start fast and stay small (it imports neither ``json`` nor
``re``, nor ``typing``). From ``allocator`` it imports only the package's
(empty) ``__init__`` files and :mod:`allocator.agent.shim.core`, which is
standard library only too.
"""

from __future__ import annotations

import os
import signal
import sys

_TYPE_CHECKING = False  # ``typing`` is an import the shim does without
TYPE_CHECKING = _TYPE_CHECKING
if TYPE_CHECKING:
    import socket

__all__ = [
    "EXIT_HANDOVER",
    "EXIT_NO_STATUS",
    "HANDED",
    "IDLE",
    "NO_VALUE",
    "decode_handover",
    "encode_handover",
    "frame",
    "main",
    "parse_env",
    "read_env",
    "unframe",
]

if not __package__:  # run as the shim (``-I -S``): find ``allocator`` where this file lies
    sys.path.append(
        os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        )
    )
from allocator.agent.shim import core  # noqa: E402 - the path first

#: Spelling of "not given" for the CGROUP, RUNAS and CWD arguments.
NO_VALUE = core.NO_VALUE
#: The first argument of a warm shim: ``IDLE SOCKET_FD STATE_DIR`` (see :func:`main`).
IDLE = "--idle"
#: ENVFD of a warm shim's hand-over: the environment came in the same frame.
HANDED = "+"
#: The shim's exit when the hand-over was incomplete, or its status file unwritable:
#: in both cases it started nothing (see :mod:`allocator.agent.processes.launch`).
EXIT_HANDOVER = core.EXIT_HANDOVER
EXIT_NO_STATUS = core.EXIT_NO_STATUS
_FRAME_HEAD = 8
#: Ends every frame: a frame cut short (the writer died) never ends with it.
_FRAME_END = b"\0allocator-frame-end\0"


def _arguments(argv: list[str]) -> tuple[str, float, str, str, str, str, list[str]]:
    status, grace, cgroup, runas, cwd, env_fd, separator, *command = argv
    if separator != "--" or not command:
        raise ValueError("expected STATUS GRACE CGROUP RUNAS CWD ENVFD -- COMMAND...")
    return status, float(grace), cgroup, runas, cwd, env_fd, command


def read_env(fd: int) -> tuple[dict[str, str], dict[str, str]]:
    """The worker's environment and the shim's settings from pipe ``fd`` (one frame).

    ``KEY=VALUE`` entries separated by NULs; an empty entry ends the
    environment, and the entries after it are settings (``cpus=0-3``).
    ``ValueError`` when the frame is not whole.
    """
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return parse_env(unframe(b"".join(chunks)))


def frame(body: bytes) -> bytes:
    """``body`` as one frame: its length (8 bytes, big-endian), itself, the end marker."""
    return len(body).to_bytes(_FRAME_HEAD, "big") + body + _FRAME_END


def unframe(data: bytes) -> bytes:
    """The body of exactly one whole frame; ``ValueError`` naming what is missing."""
    whole = _FRAME_HEAD + _frame_length(data) + len(_FRAME_END) if len(data) >= _FRAME_HEAD else -1
    if len(data) != whole or not data.endswith(_FRAME_END):
        raise ValueError(f"incomplete hand-over ({len(data)} of {max(whole, _FRAME_HEAD)} bytes)")
    return data[_FRAME_HEAD : -len(_FRAME_END)]


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
        runas = core.parse_runas(runas_text)
        if handed is not None:
            env, settings = parse_env(handed)
        elif env_fd == NO_VALUE:
            env, settings = dict(os.environ), {}
        else:
            env, settings = _read_handover(int(env_fd), status_path)
        cpus = core.parse_cpus(settings["cpus"]) if settings.get("cpus") else None
    except _Incomplete as exc:
        return exc.code
    except (ValueError, OSError) as exc:
        core.say(f"bad arguments: {exc}")
        return 2
    waited = core.WAITED
    # Blocked from the start: a stop that comes while the worker is being
    # started waits for it, and SIGCHLD is taken in the loop, never lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    if not core.prctl(core.PR_SET_CHILD_SUBREAPER, 1):
        core.say("cannot become a child subreaper; processes that leave the worker may escape")
    if cgroup != NO_VALUE:
        core.join_cgroup(cgroup)
    status = core.Status(status_path, _status_fields(settings))
    if not status.write(state="starting"):
        core.say("not starting the worker: no agent could find it again")
        return EXIT_NO_STATUS
    pid, code, error = core.launch(command, env, None if cwd == NO_VALUE else cwd, runas, cpus)
    if error:
        os.waitpid(pid, 0)
        core.say(error)
        status.write(state="failed", exit_code=code, error=error)
        return code
    status.write(state="running", pid=pid, start_ticks=core.start_ticks(pid))
    supervision = core.Supervision(pid, grace, status, agent)
    if settings.get("stop"):
        supervision.stop_command = (settings["stop"].split("\x1f"), env)
    return supervision.run(waited)


class _Incomplete(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _read_handover(fd: int, status_path: str) -> tuple[dict[str, str], dict[str, str]]:
    """The cold shim's environment; a partial one is refused and said (status and log)."""
    try:
        return read_env(fd)
    except ValueError as exc:
        error = f"{exc}: the worker was not started"
        core.say(error)
        core.Status(status_path).write(state="failed", exit_code=EXIT_HANDOVER, error=error)
        raise _Incomplete(EXIT_HANDOVER) from None


def _status_fields(settings: dict[str, str]) -> dict[str, str]:
    """The ``status.NAME`` settings: fields the agent wants in the status file."""
    return {k[len("status.") :]: v for k, v in settings.items() if k.startswith("status.")}


def _idle(argv: list[str]) -> int:
    """A warm shim: wait on socket ``argv[0]`` for a worker, then run it as a cold shim would.

    The agent sends one frame (its length, then the shim's arguments and the
    worker's environment, see :func:`encode_handover`) with the worker's log
    attached. End of file before a whole frame means the agent is gone (or
    closed this shim): exit, having started nothing.
    """
    import socket  # only a warm shim needs it, and it imports it while idle

    core.prctl(core.PR_SET_CHILD_SUBREAPER, 0)  # resolve libc now, not when a worker waits
    with socket.socket(fileno=int(argv[0])) as sock:
        received, log = _receive(sock)
    if received is None or log is None:
        return 0
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        args, payload = decode_handover(received)
    except ValueError as exc:
        core.say(f"bad hand-over: {exc}")
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
    while len(data) < _FRAME_HEAD or len(data) < _whole(data):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    try:
        return unframe(bytes(data)), log
    except ValueError:  # the agent died (or closed it) mid-frame: nothing to run
        if log is not None:
            os.close(log)
        return None, None


def _whole(data: bytes | bytearray) -> int:
    return _FRAME_HEAD + _frame_length(data) + len(_FRAME_END)


def _frame_length(data: bytes | bytearray) -> int:
    return int.from_bytes(data[:_FRAME_HEAD], "big")


def encode_handover(args: list[str], payload: bytes) -> bytes:
    """The frame a warm shim is handed: length, argument count, arguments, environment, end."""
    body = b"\0".join([str(len(args)).encode(), *(os.fsencode(a) for a in args), payload])
    return frame(body)


def decode_handover(body: bytes) -> tuple[list[str], bytes]:
    """The arguments and the environment payload of a frame's body (``ValueError`` if bad)."""
    count_text, _, rest = body.partition(b"\0")
    count = int(count_text)
    parts = rest.split(b"\0", count)
    if count < 0 or len(parts) != count + 1:
        raise ValueError("truncated arguments")
    return [os.fsdecode(part) for part in parts[:count]], parts[count]


if __name__ == "__main__":
    # Nothing is buffered (every write is ``os.write``): skip the interpreter's
    # teardown, so that the shim's end, which the agent waits for, comes at once.
    os._exit(main(sys.argv[1:]))
