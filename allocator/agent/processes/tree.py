"""A worker's whole process tree: observe it, stop it, kill it, adopt it after a restart.

The tree is the shim and everything below it. The shim is a child
subreaper, so a process that moves to a session of its own (torchrun's
ranks, a ``setsid`` helper) is still its descendant; where the agent could
make a cgroup for the worker, the cgroup holds the tree too, even after the
shim died. So:

* *alive*: the shim runs; or, once it is gone, its cgroup still has members
  or its process group still has processes (its orphans);
* *stop*: SIGTERM to the shim, which passes it to every descendant;
* *kill*: SIGKILL to every descendant (psutil walks the tree, checking each
  process's start time) and every cgroup member, sparing the shim so that it
  reaps them and writes the exit status; the shim itself only if it is
  still there long after (stuck); once the shim is gone, the group and cgroup;
* *exit code*: what the shim wrote in its status file (it outlives the
  agent), else the shim's own exit status, else unknown.

Workers recorded by an agent that ran them without a shim are still
handled the old way: their main process leads the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import (
    cgroup_members,
    cgroup_populated,
    kill_cgroup,
    remove_cgroup,
    signal_cgroup,
)
from allocator.agent.planning.containers import cid_path
from allocator.agent.planning.exit_codes import UNKNOWN_EXIT
from allocator.agent.processes.container_launch import remove_orphaned_container
from allocator.agent.processes.job_state import WorkerRuntime
from allocator.agent.processes.worker_status import read_shim_status, status_signature

__all__ = [
    "adopt_worker",
    "discard",
    "finished",
    "kill_tree",
    "observe",
    "poll_leader",
    "settle",
    "shim_running",
    "signal_main",
    "stop_tree",
]


def observe(worker: WorkerRuntime) -> int | None:
    """Reap what is ours, read the shim's news; return the exit code once it becomes known."""
    ours = (worker.popen is not None and worker.shim_code is None) or _group_is_ours(worker)
    for pid, code in procs.reap_group(worker.pgid) if ours and worker.pid > 0 else ():
        if pid == worker.pid:
            worker.shim_code = code
            if worker.popen is not None and worker.popen.returncode is None:
                worker.popen.returncode = code  # reaped: Popen must never wait on it again
    _reap_strays(worker)
    if worker.exit_code is not None or worker.pid <= 0:
        return None
    if not worker.shim:  # the main process leads the group: its reaped status is the exit
        return worker.shim_code if worker.shim_code is not None else poll_leader(worker)
    reported = _read_status(worker, force=False)
    if reported is not None:
        return reported
    if shim_running(worker):
        return None
    # The shim ended: a last look at its status (it may have just been written),
    # else its own exit status (137 if it was killed outright; so was its worker).
    reported = _read_status(worker, force=True)
    if reported is not None:
        return reported
    if worker.shim_code is not None:
        return worker.shim_code
    return _zombie_code(worker)


def _reap_strays(worker: WorkerRuntime) -> None:
    """Reap the tree's processes that were reparented to the agent, once they are zombies."""
    for pid, ticks in list(worker.strays.items()):
        stat = procs.read_stat(pid)
        if stat is None or stat.start_ticks != ticks:
            del worker.strays[pid]  # gone (someone else reaped it) or the pid is another's now
        elif stat.state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            del worker.strays[pid]


def _note_strays(worker: WorkerRuntime) -> None:
    """Remember the cgroup's members: once the shim is gone, they may come to the agent."""
    for pid in cgroup_members(Path(worker.cgroup)):
        stat = procs.read_stat(pid)
        if stat is not None:
            worker.strays[pid] = stat.start_ticks


def _read_status(worker: WorkerRuntime, *, force: bool) -> int | None:
    """Take in a rewritten status file: the main pid, a failed start, an exit code."""
    path = Path(worker.status_path)
    seen = status_signature(path)
    if seen is None or (seen == worker.status_seen and not force):
        return None
    worker.status_seen = seen
    status = read_shim_status(path)
    if status is None or status.shim_pid != worker.pid:
        return None
    known = None not in (status.shim_start_ticks, worker.start_ticks)
    if known and status.shim_start_ticks != worker.start_ticks:
        return None  # written by another shim that had the same pid: not this worker's news
    if status.pid and not worker.main_pid:
        worker.main_pid, worker.main_ticks = status.pid, status.start_ticks
    if status.state == "failed" and status.error:
        worker.error = status.error
    return status.exit_code


def _zombie_code(worker: WorkerRuntime) -> int:
    stat = procs.read_stat(worker.pid)
    if stat is None or stat.state != "Z" or stat.exit_status is None:
        return UNKNOWN_EXIT
    if worker.start_ticks not in (None, stat.start_ticks):
        return UNKNOWN_EXIT
    try:  # a zombie's /proc entry still holds its wait status (Linux >= 3.5)
        return procs.exit_code_of(stat.exit_status)
    except ValueError:
        return UNKNOWN_EXIT


def poll_leader(worker: WorkerRuntime) -> int | None:
    """Poll a main process that may not be our child: None while it runs, else its exit code."""
    stat = procs.read_stat(worker.pid)
    same = stat is not None and worker.start_ticks in (None, stat.start_ticks)
    if stat is None or not same:
        return UNKNOWN_EXIT
    if stat.state != "Z":
        return None
    if stat.ppid == os.getpid():
        return None  # our own zombie: reap_group collects its status on the next tick
    return _zombie_code(worker)


def shim_running(worker: WorkerRuntime) -> bool:
    """Whether the worker's shim (its main process, for a worker without one) still runs."""
    if worker.pid <= 0 or worker.shim_code is not None:
        return False
    return procs.same_process_alive(worker.pid, worker.start_ticks)


def finished(worker: WorkerRuntime) -> bool:
    """Whether nothing of the worker's tree is left (call :func:`observe` first)."""
    if worker.pid <= 0:
        return True
    if worker.shim and shim_running(worker):
        return False
    if worker.shim and not _container_gone(worker):
        return False
    if worker.strays or (worker.cgroup and cgroup_populated(Path(worker.cgroup))):
        return False
    return not (_group_is_ours(worker) and procs.group_alive(worker.pgid))


def _container_gone(worker: WorkerRuntime) -> bool:
    """Whether the worker's container, if it ran in one, is gone now that its shim is."""
    status = read_shim_status(Path(worker.status_path)) if worker.status_path else None
    if status is None or not status.container:
        return True
    recorded = status.exit_code if status.state == "exited" else None
    return remove_orphaned_container(status.container, status.engine, recorded)


def _group_is_ours(worker: WorkerRuntime) -> bool:
    """Whether the process group numbered like the shim can still be the worker's.

    The kernel never hands out a pid still used as a group id, so a live
    process with that pid but another start time leads someone else's group.
    """
    stat = procs.read_stat(worker.pgid)
    return stat is None or worker.start_ticks in (None, stat.start_ticks)


def stop_tree(worker: WorkerRuntime, signum: int) -> None:
    """Ask the whole tree to stop: through the shim, else straight to what is left."""
    if worker.shim and shim_running(worker):
        procs.signal_process(worker.pid, signum)
        return
    if _group_is_ours(worker):
        procs.signal_group(worker.pgid, signum)
    if worker.cgroup:
        _note_strays(worker)
        signal_cgroup(Path(worker.cgroup), signum)


def kill_tree(worker: WorkerRuntime, *, shim_too: bool) -> None:
    """SIGKILL the tree below the shim (and the shim itself when ``shim_too`` or it is gone)."""
    if worker.shim and shim_running(worker):
        for pid in _descendants(worker.pid, worker.start_ticks):
            procs.signal_process(pid, signal.SIGKILL)
        if worker.cgroup:
            signal_cgroup(Path(worker.cgroup), signal.SIGKILL, spare=worker.pid)
        if not shim_too:
            return
    if _group_is_ours(worker):
        procs.signal_group(worker.pgid, signal.SIGKILL)
    if worker.cgroup:
        _note_strays(worker)
        kill_cgroup(Path(worker.cgroup))


def _descendants(pid: int, start_ticks: int | None) -> list[int]:
    """Every process below ``pid`` (whatever session it is in), via the parent links in /proc."""
    import psutil  # only needed to kill: kept off the agent's start-up

    if not procs.same_process_alive(pid, start_ticks):
        return []
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def signal_main(worker: WorkerRuntime, signum: int) -> bool:
    """Deliver an ``on_change`` signal: to the shim, which passes it to the main process."""
    if not shim_running(worker):
        return False
    return procs.signal_process(worker.pid, signum)


def adopt_worker(worker: WorkerRuntime) -> str:
    """Decide what a worker read back from the state file is now, updating it in place.

    ``adopted`` (its shim still runs), ``ended`` (its shim is gone: the next
    tick reads how the worker ended from the status file), ``never-started``
    (the agent died while launching it), ``exited`` (known before),
    ``reused`` (the pid is another process now and nothing says how the
    worker ended), and for workers without a shim ``gone`` or ``orphans``.
    """
    if worker.group_gone:
        return "exited"
    if worker.shim:
        return _adopt_shim(worker)
    return _adopt_legacy(worker)


def _adopt_shim(worker: WorkerRuntime) -> str:
    if worker.pid <= 0 and worker.exit_code is None:
        status = read_shim_status(Path(worker.status_path))
        if status is None or status.shim_pid <= 0:  # no shim started: nothing ran or counts
            worker.exit_code, worker.stop_sent, worker.group_gone = UNKNOWN_EXIT, True, True
            return "never-started"
        worker.pid, worker.start_ticks = status.shim_pid, status.shim_start_ticks
    if worker.pid <= 0:
        worker.group_gone = True
        return "exited"
    worker.adopted = True
    if shim_running(worker):
        return "adopted"
    return "ended"


def _adopt_legacy(worker: WorkerRuntime) -> str:
    if worker.pid <= 0:
        worker.group_gone = True
        return "exited"
    stat = procs.read_stat(worker.pid)
    same = stat is not None and worker.start_ticks in (None, stat.start_ticks)
    if stat is not None and not same:
        # The pid now names another process: leave it and its group alone.
        worker.exit_code = UNKNOWN_EXIT if worker.exit_code is None else worker.exit_code
        worker.group_gone = True
        return "reused"
    if same and worker.exit_code is None:
        worker.adopted = True  # running (or a zombie whose status tick() collects)
        return "adopted"
    worker.exit_code = UNKNOWN_EXIT if worker.exit_code is None else worker.exit_code
    # The main process is gone; a live group with its id can only be its orphans.
    worker.group_gone = not procs.group_alive(worker.pgid)
    return "gone" if worker.group_gone else "orphans"


def settle(worker: WorkerRuntime) -> None:
    """Once nothing of the tree is left: remove its cgroup, and tell Popen its shim is done."""
    if worker.cgroup:
        remove_cgroup(Path(worker.cgroup))
    if worker.popen is not None and worker.popen.returncode is None:
        # Reaped already (by us, or by someone who took our child): Popen must not wait on it.
        code = worker.shim_code if worker.shim_code is not None else worker.exit_code
        worker.popen.returncode = code if code is not None else UNKNOWN_EXIT


def discard(worker: WorkerRuntime) -> None:
    """Remove the worker's status file, cidfile and cgroup once nothing of it is tracked."""
    if worker.status_path:
        for path in (worker.status_path, cid_path(worker.status_path)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    if worker.cgroup:
        remove_cgroup(Path(worker.cgroup))
