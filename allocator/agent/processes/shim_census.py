"""Before adoption: wait for shims an agent that just died was still starting.

An agent killed between starting a shim and saving its pid leaves a shim
whose status file says ``prepared`` (written by the agent) or nothing yet:
within moments that shim either refuses (an incomplete hand-over, its
status says so) or runs its worker and says so in its status file. Adopting
before it has spoken would call the worker never started, and the job would
start a second copy. So the restarted agent first finds the live shims of
its state directory in ``/proc`` (a cold shim names its status file on its
command line, a warm one its state directory) and waits, a bounded time,
until each has written a status file naming itself or is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path

from allocator.agent.kernel import procs
from allocator.agent.processes.launch import SHIM
from allocator.agent.processes.worker_status import read_shim_status
from allocator.agent.shim.main import IDLE

__all__ = ["SETTLE_SECONDS", "wait_for_starting_shims"]

#: The longest adoption waits for shims to report (a shim's start is ~50 ms).
SETTLE_SECONDS = 3.0
_POLL_SECONDS = 0.01


def wait_for_starting_shims(
    state_dir: Path,
    status_dir: Path,
    *,
    ours: Collection[int] = (),
    seconds: float = SETTLE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> list[int]:
    """Wait until every live shim of ``state_dir`` has reported; return those that never did.

    ``ours``: shims of the calling agent itself (its idle warm shim), never waited for.
    """
    deadline = clock() + seconds
    while True:
        silent = [pid for pid in _silent_shims(state_dir, status_dir) if pid not in ours]
        if not silent or clock() >= deadline:
            return silent
        time.sleep(_POLL_SECONDS)


def _silent_shims(state_dir: Path, status_dir: Path) -> list[int]:
    """Live shims of ``state_dir`` that no status file names yet."""
    named = set()
    for path in status_dir.glob("*.status") if status_dir.is_dir() else ():
        status = read_shim_status(path)
        if status is not None and status.shim_pid > 0:
            named.add(status.shim_pid)
    return [
        pid
        for pid, argv in _shims()
        if pid not in named and _of(argv, state_dir, status_dir) and _alive(pid)
    ]


def _shims() -> list[tuple[int, list[str]]]:
    """Every process running the shim program, with its arguments."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [
                a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")
            ]
        except OSError:
            continue
        if str(SHIM) in argv:
            found.append((int(entry.name), argv[argv.index(str(SHIM)) + 1 :]))
    return found


def _of(argv: list[str], state_dir: Path, status_dir: Path) -> bool:
    """Whether the shim with these arguments belongs to this state directory."""
    if argv[:1] == [IDLE]:
        return len(argv) > 2 and argv[2] == str(state_dir)
    return bool(argv) and Path(argv[0]).parent == status_dir


def _alive(pid: int) -> bool:
    stat = procs.read_stat(pid)
    return stat is not None and stat.state != "Z"
