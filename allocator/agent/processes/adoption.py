"""Taking over the jobs an earlier agent recorded: what each of their workers is now.

Every job the state file names is tracked again, running or not: a worker
whose shim still runs is adopted; one whose shim ended stays tracked until
the supervisor reads how it ended from the shim's status file, so a clean
exit stays finished (it is never run again) and a crash counts as one; a
stop that was under way carries on. A job the agent died launching (some
worker never started) is reported, for the supervisor to restart it whole.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.agent.processes import procs, tree
from allocator.agent.processes.cgroups import remove_cgroup
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime
from allocator.agent.processes.launch import read_shim_status
from allocator.agent.processes.state_file import job_from_state

__all__ = ["AdoptReport", "AdoptedWorker", "sweep", "take_over"]

Log = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class AdoptedWorker:
    """What adoption decided for one recorded worker (see :func:`tree.adopt_worker`)."""

    job: str
    index: int
    pid: int
    outcome: str


@dataclass(frozen=True, slots=True)
class AdoptReport:
    """Jobs from the state file: adopted (running), ended (tracked for their exit), stale (bad)."""

    adopted: tuple[str, ...]
    stale: tuple[str, ...]
    workers: tuple[AdoptedWorker, ...]
    ended: tuple[str, ...] = ()
    half_started: tuple[str, ...] = ()  # some worker never started: restart the job whole


def take_over(
    entries: Mapping[str, Any], tracked: set[str], log: Log
) -> tuple[dict[str, JobRuntime], AdoptReport]:
    """Rebuild the recorded jobs not ``tracked`` already; an unreadable entry is stale."""
    jobs: dict[str, JobRuntime] = {}
    adopted: list[str] = []
    ended: list[str] = []
    stale: list[str] = []
    half: list[str] = []
    outcomes: list[AdoptedWorker] = []
    for name, entry in sorted(entries.items()):
        if name in tracked:
            continue
        try:
            job = job_from_state(entry)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log("adopt-skipped", {"job": name, "error": f"bad state entry: {exc}"})
            stale.append(name)
            continue
        found = [_adopt(name, worker) for worker in job.workers]
        outcomes.extend(found)
        jobs[name] = job
        running = any(w.outcome == "adopted" for w in found)
        (adopted if running else ended).append(name)
        if any(w.outcome == "never-started" for w in found):
            half.append(name)
    report = AdoptReport(tuple(adopted), tuple(stale), tuple(outcomes), tuple(ended), tuple(half))
    return jobs, report


def _adopt(job: str, worker: WorkerRuntime) -> AdoptedWorker:
    outcome = tree.adopt_worker(worker)  # may learn the pid (from the shim's status file)
    return AdoptedWorker(job, worker.spec.index, worker.pid, outcome)


def sweep(
    status_dir: Path, cgroup_base: Path | None, jobs: Mapping[str, JobRuntime], log: Log
) -> None:
    """Clear what no tracked worker names: old status files, empty cgroups, unknown shims.

    A shim still running that no state entry names (the state file was lost)
    runs a worker nobody would stop and whose job the planner would start a
    second time: it is told to stop (its shim stops the whole tree).
    """
    workers = [worker for job in jobs.values() for worker in job.workers]
    named = {worker.status_path for worker in workers}
    with contextlib.suppress(OSError):
        for path in sorted(status_dir.glob("*.status")):
            if str(path) not in named:
                _sweep_status(path, log)
    if cgroup_base is not None:
        kept = {worker.cgroup for worker in workers}
        with contextlib.suppress(OSError):
            for path in cgroup_base.iterdir():
                if path.is_dir() and str(path) not in kept:
                    remove_cgroup(path)  # only an empty one goes


def _sweep_status(path: Path, log: Log) -> None:
    status = read_shim_status(path)
    if status is not None and procs.same_process_alive(status.shim_pid, status.shim_start_ticks):
        log("unknown-worker-stopped", {"status": str(path), "shim_pid": status.shim_pid})
        procs.signal_process(status.shim_pid, signal.SIGTERM)
        return  # its file goes once it is gone, at a later restart
    with contextlib.suppress(OSError):
        path.unlink()
