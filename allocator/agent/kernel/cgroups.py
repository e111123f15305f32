"""One cgroup (v2) per worker, where the agent may create them.

A cgroup holds every process the worker ever forks, whatever session it
moves to and whichever process it is reparented to, and across agent
restarts: the exact answer to "is anything of this worker left?"
(``cgroup.events``: ``populated 0``) and to "kill all of it"
(``cgroup.kill``, Linux >= 5.14; else SIGKILL to each member). The agent
creates ``<its own cgroup>/allocator/<agent>/<job>.<index>.<token>`` for each worker;
the shim moves itself in before it forks the worker, so nothing escapes.

Where the agent may not (no cgroup2 mount, a read-only ``/sys/fs/cgroup`` in
a container, no delegation), :func:`worker_cgroup_base` says so and the
agent tracks trees by ancestry alone (the shim is their subreaper). Under
systemd the unit's ``Delegate=yes`` hands the agent its subtree. No
controller is enabled: the cgroups group processes, they limit nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
from pathlib import Path

__all__ = [
    "RUNS_SCOPE",
    "agent_scope",
    "cgroup_members",
    "cgroup_populated",
    "create_worker_cgroup",
    "kill_cgroup",
    "process_cgroup",
    "remove_cgroup",
    "signal_cgroup",
    "worker_cgroup_base",
]

_BASE_NAME = "allocator"
#: The scope below ``allocator/`` where ``allocator run`` puts its commands' cgroups.
RUNS_SCOPE = "runs"


def worker_cgroup_base(
    mountinfo: Path = Path("/proc/self/mountinfo"),
    own: Path = Path("/proc/self/cgroup"),
    scope: str = "",
) -> tuple[Path | None, str]:
    """Where worker cgroups go, or None and why not (``(None, reason)``).

    ``scope`` names this agent's own directory below ``allocator/`` (see the
    module docstring).
    """
    mount = _cgroup2_mount(mountinfo)
    if mount is None:
        return None, "no cgroup2 file system is mounted"
    relative = _own_cgroup(own)
    if relative is None:
        return None, "this process is in no cgroup2 group"
    base = mount / relative.lstrip("/") / _BASE_NAME
    if scope:
        base = base / scope
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".probe-{secrets.token_hex(4)}"
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return None, f"cannot create cgroups under {base.parent}: {exc.strerror or exc}"
    return base, ""


def agent_scope(state_dir: Path) -> str:
    """The name of one agent's cgroup directory: a digest of its state directory's path."""
    import hashlib

    return "agent-" + hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def _cgroup2_mount(mountinfo: Path) -> Path | None:
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(fields[4])
    return None


def _own_cgroup(own: Path) -> str | None:
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def process_cgroup(
    pid: int, mountinfo: Path = Path("/proc/self/mountinfo"), proc: Path = Path("/proc")
) -> Path | None:
    """The cgroup (v2) directory process ``pid`` is in, as this process sees it; None if none."""
    mount = _cgroup2_mount(mountinfo)
    relative = _own_cgroup(proc / str(pid) / "cgroup")
    if mount is None or relative is None:
        return None
    return mount / relative.lstrip("/")


def create_worker_cgroup(base: Path, name: str) -> Path | None:
    """Make a fresh cgroup for one worker (None if the kernel says no)."""
    path = base / name
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def cgroup_members(path: Path) -> list[int]:
    """Pids of the live processes in the cgroup (none once it is gone)."""
    try:
        return [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def cgroup_populated(path: Path) -> bool:
    """Whether any process is left in the cgroup (or in one below it)."""
    try:
        events = (path / "cgroup.events").read_text().split()
    except OSError:
        return False
    return "populated" in events and events[events.index("populated") + 1] == "1"


def signal_cgroup(path: Path, signum: int, *, spare: int = 0) -> list[int]:
    """Send ``signum`` to every member except ``spare``; return the pids signalled."""
    sent = []
    for pid in cgroup_members(path):
        if pid != spare:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
                sent.append(pid)
    return sent


def kill_cgroup(path: Path) -> None:
    """SIGKILL every process of the cgroup at once (``cgroup.kill``), else one by one."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        signal_cgroup(path, signal.SIGKILL)


def remove_cgroup(path: Path) -> None:
    """Remove an empty worker cgroup; a cgroup still in use stays (and is retried later)."""
    with contextlib.suppress(OSError):
        path.rmdir()
