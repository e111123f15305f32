"""Where the command server listens and what passes between it and a client.

One request: the client's words, environment, working directory, umask,
resource limits and the signals it ignores (``marshal``, length-prefixed),
with its stdin, stdout and stderr attached as file descriptors
(``SCM_RIGHTS``). Then single bytes:

- server -> client ``D`` (declined: run it yourself) or ``A`` and the worker's
  pid in 4 bytes (accepted, ready; Ctrl-Z and ``fg`` reach that pid with the
  client);
- client -> server ``G`` (go): only then does the worker run the command, so a
  client that gave up waiting runs it itself and the worker never does;
- client -> server ``S`` + a signal number: a signal the client received;
- server -> client ``X`` + a 4-byte exit status, once the command ended.

Only the standard library's cheapest modules are imported: the client pays
for every one on each command.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from collections.abc import Mapping
else:
    import _signal  # the C half of signal: its Python half imports enum

__all__ = [
    "ACCEPTED",
    "DECLINED",
    "EXITED",
    "GO",
    "LIMITS",
    "MAX_PATH",
    "PROTOCOL",
    "SERVED",
    "SIGNAL",
    "STARTS_PROCESSES",
    "START_BACKOFF_SECONDS",
    "Request",
    "decode_request",
    "enabled",
    "encode_request",
    "socket_path",
]

#: Changes whenever a request's shape does: a server of another protocol declines.
PROTOCOL = 2
DECLINED = b"D"
ACCEPTED = b"A"
GO = b"G"
SIGNAL = b"S"
EXITED = b"X"
#: Commands a server runs. ``agent`` and ``serve`` run for days, ``demo``
#: starts agents, ``doctor`` probes this host's devices: each runs in its own
#: process, and starts no server.
SERVED = frozenset(
    {"set", "get", "release", "status", "history", "queue", "cancel", "policy", "env"}
    | {"submit", "usage", "run"}
)
#: Served commands that start the user's processes: their worker must be its
#: client's double (cgroup, namespaces, CPUs, limits...), or it declines.
STARTS_PROCESSES = frozenset({"run"})
#: The resource limits a worker takes from its client: every one (a command's
#: processes inherit them; a full disk is an RLIMIT_FSIZE in tests).
LIMITS = (
    "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_LOCKS",
    "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_NOFILE", "RLIMIT_NPROC",
    "RLIMIT_RSS", "RLIMIT_RTPRIO", "RLIMIT_RTTIME", "RLIMIT_SIGPENDING", "RLIMIT_STACK",
)  # fmt: skip
#: Signals whose disposition a worker takes from its client when the client
#: ignores them (``nohup``'s SIGHUP): the command, and what it starts, ignore them too.
INHERITED_IGNORED: tuple[int, ...] = (
    _signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM, _signal.SIGTSTP,
    _signal.SIGTTIN, _signal.SIGTTOU,
)  # fmt: skip
#: A Unix socket's path must fit in sun_path (108 bytes on Linux, with its NUL).
MAX_PATH = 107
#: After a server was started, how long clients wait before starting another.
START_BACKOFF_SECONDS = 60.0
_OFF = frozenset({"0", "off", "no", "false"})

#: (protocol, argv, environment, cwd, umask, limits, ignored signals): bytes where
#: the OS keeps bytes.
Request = tuple[
    int, list[bytes], dict[bytes, bytes], bytes, int, list[tuple[int, int, int]], list[int]
]


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether this client may use a server: Linux (peer credentials), not turned off."""
    return sys.platform == "linux" and environ.get("ALLOCATOR_SERVER", "1").lower() not in _OFF


def socket_path(environ: Mapping[str, str], package_dir: str) -> str | None:
    """The socket of the server for this user, Python environment and installed package.

    ``None`` when the directory is not safely this user's (owned by another,
    open to others, a symlink): the client then runs every command itself. A
    different interpreter or package directory (another virtualenv, a source
    tree on PYTHONPATH) gets a server of its own. So does a client in another
    cgroup (another login session, a batch job's step): a worker lives in its
    server's cgroup, and a served command must be accounted, limited and
    stopped with the session that gave it.
    """
    base = environ.get("XDG_RUNTIME_DIR") or "/tmp"
    directory = os.path.join(base, f"allocator-{os.getuid()}")
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        found = os.lstat(directory)
    except OSError:
        return None
    if (
        not stat.S_ISDIR(found.st_mode)
        or found.st_uid != os.getuid()
        or stat.S_IMODE(found.st_mode) & 0o077
    ):
        return None
    # sys.prefix, not sys.executable: `python` and `python3` of one virtualenv
    # are one interpreter, and must find one server.
    key = zlib.crc32(f"{PROTOCOL}\0{sys.prefix}\0{package_dir}\0".encode() + own_cgroup())
    path = os.path.join(directory, f"server-{key:08x}.sock")
    return path if len(os.fsencode(path)) <= MAX_PATH else None


def own_cgroup() -> bytes:
    """This process's cgroup membership, as the kernel lists it (empty where none)."""
    try:
        with open("/proc/self/cgroup", "rb") as found:
            return found.read()
    except OSError:
        return b""


def encode_request(argv: list[str], ignored: list[int] | None = None) -> bytes:
    """This process's request to run ``argv``, length-prefixed.

    ``ignored``: the signals of :data:`INHERITED_IGNORED` this process ignores.
    """
    mask = os.umask(0o022)
    os.umask(mask)
    body = marshal.dumps(
        (
            PROTOCOL,
            [os.fsencode(word) for word in argv],
            dict(os.environb),
            os.getcwdb(),
            mask,
            _limits(),
            [int(number) for number in ignored or ()],
        )
    )
    return len(body).to_bytes(4, "big") + body


def decode_request(body: bytes) -> Request:
    """A request's body (after its length), checked for shape; ``ValueError`` otherwise."""
    try:
        found = marshal.loads(body)
    except (EOFError, TypeError, ValueError) as error:
        raise ValueError(f"not a request: {error}") from None
    if not isinstance(found, tuple) or len(found) != 7 or found[0] != PROTOCOL:
        raise ValueError("not a request of this protocol")
    _, argv, environ, cwd, mask, limits, ignored = found
    if not (
        isinstance(argv, list)
        and all(isinstance(word, bytes) for word in argv)
        and isinstance(environ, dict)
        and all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in environ.items())
        and isinstance(cwd, bytes)
        and isinstance(mask, int)
        and isinstance(limits, list)
        and all(isinstance(item, tuple) and len(item) == 3 for item in limits)
        and isinstance(ignored, list)
        and all(number in INHERITED_IGNORED for number in ignored)
    ):
        raise ValueError("a request with fields of the wrong types")
    return (PROTOCOL, argv, environ, cwd, mask, limits, ignored)


def _limits() -> list[tuple[int, int, int]]:
    import resource

    found = []
    for name in LIMITS:
        which = getattr(resource, name, None)
        if which is not None:
            soft, hard = resource.getrlimit(which)
            found.append((which, soft, hard))
    return found
