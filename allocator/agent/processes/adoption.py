"""Taking over the jobs an earlier agent recorded: what each of their workers is now.

Every job the state file names is tracked again, running or not: a worker
whose shim still runs is adopted; one whose shim ended stays tracked until
the supervisor reads how it ended from the shim's status file, so a clean
exit stays finished (it is never run again) and a crash counts as one; a
stop that was under way carries on. A job the agent died launching (some
worker never started) is reported, for the supervisor to restart it whole.

A live shim of this boot that no state entry names (the state file was
unreadable, from a newer agent, or lost) is adopted from its own status
file (:func:`from_status_files`), which holds its pid and start time, the
job, the worker's index, the spec's fingerprint, GPUs and assignment
revision: its job is then tracked like any other, so the planner keeps it,
or stops it and starts the job again only once every copy is gone. So is a
shim of this boot that ended while no agent ran, once its file says how its
worker exited and under which assignment: the job is finished (or
restarted, as its ``restart`` rule says), never started again as if new;
and one killed while its worker ran: what it left (a setsid rank in its
cgroup, a container) is the job's, stopped before the job starts again.
A status file from another boot is never acted on: its pids name other
processes now.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import remove_cgroup
from allocator.agent.planning.types import DesiredJob, WorkerSpec
from allocator.agent.processes import tree
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime
from allocator.agent.processes.state_file import job_from_state
from allocator.agent.processes.worker_status import ShimStatus, read_shim_status

__all__ = ["AdoptReport", "AdoptedWorker", "from_status_files", "sweep", "take_over"]

#: The grace of a worker whose status file does not say (written by an older shim).
_DEFAULT_GRACE_SECONDS = 10.0

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


def from_status_files(
    status_dir: Path, boot_id: str, jobs: Mapping[str, JobRuntime], now: float
) -> dict[str, JobRuntime]:
    """Jobs not in ``jobs`` whose shims of this boot run or ended, rebuilt from their files."""
    named = {worker.status_path for job in jobs.values() for worker in job.workers}
    found: dict[str, list[tuple[ShimStatus, Path]]] = {}
    with contextlib.suppress(OSError):
        for path in sorted(status_dir.glob("*.status")):
            status = read_shim_status(path)
            if str(path) in named or status is None or not _adoptable(status, boot_id):
                continue
            job = status.job or path.name.split(".", 1)[0]  # an older shim: its file's name
            if job not in jobs:
                found.setdefault(job, []).append((status, path))
    return {job: _job_from_status(job, shims, now) for job, shims in sorted(found.items())}


def _adoptable(status: ShimStatus, boot_id: str) -> bool:
    """A live shim of this boot; or a dead one that says how its worker ended, and under
    what, or that was killed while its worker ran (what it leaves, a setsid rank in its
    cgroup, a container, is the job's until stopped: never beside a new start).

    An ended one without the revision (an older agent wrote it) is left to
    the sweep: its job could not tell an old end from the current assignment's.
    """
    if _ours_and_alive(status, boot_id):
        return True
    of_this_boot = bool(status.boot_id) and status.boot_id == boot_id
    if not of_this_boot or status.shim_pid <= 0 or status.shim_start_ticks is None:
        return False
    if status.state in ("starting", "running"):
        return True  # its shim was killed: it wrote no end
    return status.state == "exited" and status.exit_code is not None and status.revision.isdigit()


def _ours_and_alive(status: ShimStatus, boot_id: str) -> bool:
    """Whether the status names a live shim of this boot (pid and start time, the boot id)."""
    if status.boot_id and boot_id and status.boot_id != boot_id:
        return False
    if status.shim_pid <= 0 or status.shim_start_ticks is None:
        return False
    return procs.same_process_alive(status.shim_pid, status.shim_start_ticks)


def _job_from_status(job: str, shims: list[tuple[ShimStatus, Path]], now: float) -> JobRuntime:
    """A running job made of these shims; the planner compares its fingerprint as any other's."""
    first = shims[0][0]
    gpus = tuple(int(g) for g in first.gpus.split(",") if g.strip().isdigit())
    device: Any = "cpu" if first.device == "cpu" else "cuda"
    workers = []
    for number, (status, path) in enumerate(shims):
        index = int(status.index) if status.index.isdigit() else number
        worker = WorkerRuntime(
            WorkerSpec(job, index, (), {}, None, gpus, device),
            status.shim_pid,
            status.shim_start_ticks,
        )
        worker.status_path, worker.cgroup, worker.adopted = str(path), status.cgroup, True
        worker.main_pid, worker.main_ticks = status.pid, status.start_ticks
        workers.append(worker)
    desired = DesiredJob(
        job=job,
        state="run",
        workers=tuple(worker.spec for worker in workers),
        fingerprint=first.fingerprint,
        on_change="restart",
        grace_seconds=_grace(first.grace),
        max_restarts=0,
        backoff_base=0.0,
        backoff_max=0.0,
        gpus=gpus,
        device=device,
        fallback_reason=None,
        message="",
        assignment_revision=int(first.revision) if first.revision.isdigit() else 0,
    )
    return JobRuntime(desired, first.fingerprint, started_at=now, workers=workers)


def _grace(text: str) -> float:
    try:
        return max(float(text), 0.0)
    except ValueError:
        return _DEFAULT_GRACE_SECONDS


def sweep(
    status_dir: Path,
    cgroup_base: Path | None,
    jobs: Mapping[str, JobRuntime],
    log: Log,
    boot_id: str = "",
) -> None:
    """Clear what no tracked worker names: old status files, empty cgroups, unknown shims.

    A shim of this boot still running that no tracked worker names (its job
    is tracked with other workers: the state file missed it) runs a worker
    nobody would stop: it is told to stop (its shim stops the whole tree).
    A status file of another boot is only removed: its pid is someone else's.
    """
    workers = [worker for job in jobs.values() for worker in job.workers]
    named = {worker.status_path for worker in workers}
    with contextlib.suppress(OSError):
        for path in sorted(status_dir.glob("*.status")):
            if str(path) not in named:
                _sweep_status(path, log, boot_id)
    if cgroup_base is not None:
        kept = {worker.cgroup for worker in workers}
        with contextlib.suppress(OSError):
            for path in cgroup_base.iterdir():
                if path.is_dir() and str(path) not in kept:
                    remove_cgroup(path)  # only an empty one goes


def _sweep_status(path: Path, log: Log, boot_id: str) -> None:
    status = read_shim_status(path)
    if status is not None and _ours_and_alive(status, boot_id):
        log("unknown-worker-stopped", {"status": str(path), "shim_pid": status.shim_pid})
        procs.signal_process(status.shim_pid, signal.SIGTERM)
        return  # its file goes once it is gone, at a later restart
    for stale in (path, path.with_suffix(".cid")):  # and its container's id, if it had one
        with contextlib.suppress(OSError):
            stale.unlink()
