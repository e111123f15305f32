"""Low-level process helpers for the supervisor: /proc, process groups, signals, reaping.

Everything here is a thin, typed wrapper over one system call or one
``/proc`` read, with the error cases turned into plain return values so the
supervisor's logic stays readable. Linux is the target; where ``/proc`` or
``prctl`` is missing the helpers degrade (no start-time check, no
subreaper) instead of failing.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcStat",
    "become_subreaper",
    "clean_base_env",
    "current_boot_id",
    "exit_code_of",
    "group_alive",
    "parse_stat",
    "read_stat",
    "reap_group",
    "same_process_alive",
    "signal_group",
    "signal_process",
    "stat_fields",
    "ticks_to_epoch",
    "write_json_atomic",
]

# The exit status of a worker that ended while it was not our child (adopted
# after an agent restart and reaped by someone else): nothing says it succeeded,
# so it must read as non-zero, i.e. a crash.

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the supervisor needs."""

    pid: int
    state: str  # "R", "S", "D", "Z" (zombie), ...
    ppid: int
    pgrp: int
    session: int
    start_ticks: int  # field 22: clock ticks after boot; with the pid, names one process
    exit_status: int | None  # field 52 (Linux >= 3.5): waitpid-style status, set for zombies


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/<pid>/stat``; None when the process does not exist (or no /proc)."""
    try:
        return parse_stat(pid, Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):  # gone, or vanished mid-read
        return None


def stat_fields(raw: str) -> list[str]:
    """The fields of ``/proc/<pid>/stat``'s text after the command's name: field N at N - 3."""
    # The command name is in parentheses and may itself hold spaces and ")".
    return raw[raw.rindex(")") + 2 :].split()


def parse_stat(pid: int, raw: str) -> ProcStat:
    """Parse the text of ``/proc/<pid>/stat``."""
    fields = stat_fields(raw)

    def field(number: int) -> int:
        return int(fields[number - 3])

    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=field(4),
        pgrp=field(5),
        session=field(6),
        start_ticks=field(22),
        exit_status=field(52) if len(fields) >= 50 else None,
    )


def same_process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` and not a zombie.

    The start time guards against pid reuse: after a reboot or a long time a
    recorded pid may belong to an unrelated process.
    """
    stat = read_stat(pid)
    if stat is None or stat.state == "Z":
        return False
    return start_ticks is None or stat.start_ticks == start_ticks


def exit_code_of(status: int) -> int:
    """A waitpid status as an exit code: the code itself, or 128+N for death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def reap_group(pgid: int) -> list[tuple[int, int]]:
    """Reap every exited child of ours in process group ``pgid``: ``[(pid, exit code)]``.

    Waiting on ``-pgid`` (not ``-1``) collects only that group's members, so
    exit statuses of the process's other children (a probe, a test's server)
    are never stolen from their owners.
    """
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return reaped  # no child of ours left in that group
        if pid == 0:
            return reaped  # children left, none exited yet
        reaped.append((pid, exit_code_of(status)))


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies included, so reap first) is still in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is just not ours to signal
    return True


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to every process of group ``pgid``; False if the group is gone."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_process(pid: int, signum: int) -> bool:
    """Send ``signum`` to one process; False if it is gone (or ``signum`` is no signal)."""
    try:
        os.kill(pid, signum)
    except (OSError, ValueError, OverflowError):
        return False
    return True


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``).

    Why: a worker's children that outlive it would otherwise be reparented
    to init, and as zombies of init they keep the worker's process group
    alive until init gets round to reaping them. As a subreaper the agent
    inherits them, reaps them itself (``reap_group``), and so can tell
    reliably when a group is entirely gone. Returns False where unsupported.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The process's own symbols (libc's among them): ``find_library`` runs ldconfig.
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def ticks_to_epoch(start_ticks: int) -> float | None:
    """Convert a ``/proc`` start time (ticks after boot) to seconds since the epoch."""
    boot = _boot_time()
    return None if boot is None else boot + start_ticks / os.sysconf("SC_CLK_TCK")


@functools.cache
def _boot_time() -> int | None:
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        return next(int(line.split()[1]) for line in lines if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def current_boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``; "" where the kernel does not say)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def clean_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment minus its own GPU selection and every store credential.

    A worker must see only the GPUs its spec names, and never the agent's
    store credentials (``ALLOCATOR_*``, ``ETCDCTL_*``, ``CONSUL_HTTP_TOKEN``...,
    or any value holding the store password): the list is documented in
    :mod:`allocator.store.credentials`.
    """
    from allocator.gpus.vendors.registry import VISIBILITY_VARIABLES
    from allocator.store.credentials import strip_store_credentials

    kept = strip_store_credentials(environ)
    return {key: value for key, value in kept.items() if key not in VISIBILITY_VARIABLES}


def write_json_atomic(path: Path, data: Any, *, durable: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file, fsync, rename), mode 0600.

    0600 because the recorded worker environments may hold secrets from the policy.
    ``durable=False`` skips the fsync: for a file that must survive the
    writer's crash (the rename does that) but not the machine's.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, sort_keys=True)
        out.flush()
        if durable:
            os.fsync(out.fileno())
    os.replace(tmp, path)
