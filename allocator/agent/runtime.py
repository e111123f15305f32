"""The supervisor's mutable bookkeeping per job and worker, and its state-file form.

Kept apart from :mod:`allocator.agent.supervisor` (which does the process
I/O) so the counting rules and the JSON round trip read on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.agent import procs
from allocator.agent.model import DesiredJob, Device, JobView, WorkerSpec

__all__ = [
    "STABLE_RUN_SECONDS",
    "STATE_SCHEMA_VERSION",
    "JobRuntime",
    "StateFileError",
    "WorkerRuntime",
    "classify_recorded",
    "job_from_state",
    "job_to_state",
    "poll_leader",
    "read_state_file",
    "write_state_file",
]


STABLE_RUN_SECONDS = 600.0


@dataclass(slots=True)
class WorkerRuntime:
    """One worker process (its main process leads its own session and process group)."""

    spec: WorkerSpec
    pid: int  # 0: it never started (``error`` says why)
    start_ticks: int | None  # /proc start time: with the pid, names exactly one process
    popen: subprocess.Popen[bytes] | None = None  # None when adopted or never started
    exit_code: int | None = None  # of the main process; 128+N for signal N
    stop_sent: bool = False  # we asked it to stop, so its exit is not a crash
    group_gone: bool = False  # no process of its group is left (reaped and checked)
    adopted: bool = False
    error: str = ""

    @property
    def pgid(self) -> int:
        """The process group id: the main process started a new session, so its own pid."""
        return self.pid


@dataclass(slots=True)
class JobRuntime:
    """Everything the supervisor tracks for one job across restarts."""

    spec: DesiredJob  # what the current workers were started from
    fingerprint: str  # spec.fingerprint, or a later one accepted via on_change none/signal
    started_at: float  # monotonic
    workers: list[WorkerRuntime] = field(default_factory=list)
    crash_restarts: int = 0
    change_restarts: int = 0
    restarts: int = 0
    next_restart_at: float | None = None
    gave_up: bool = False
    stopping: bool = False
    stop_deadline: float | None = None
    stop_reason: str = ""
    killed: bool = False  # SIGKILL already sent for the current stop
    crashed: bool = False  # a worker crashed since the current workers started
    last_exit: int | None = None
    message: str = ""
    state: str = ""
    since: str = ""

    def alive(self) -> int:
        """Workers whose process group still has processes."""
        return sum(1 for worker in self.workers if not worker.group_gone)

    def inherit_counters(self, old: JobRuntime) -> None:
        """Carry restart counts over from the runtime this one replaces."""
        self.crash_restarts = old.crash_restarts
        self.change_restarts = old.change_restarts
        self.restarts = old.restarts

    def count_start(self, cause: str) -> None:
        """Count a start: crash restarts apart from change restarts; a new spec resets the loop."""
        if cause == "crash":
            self.crash_restarts += 1
        else:
            self.crash_restarts = 0
        if cause == "change":
            self.change_restarts += 1
        if cause != "new":
            self.restarts += 1

    def note_crash(self, code: int, message: str, ran_seconds: float) -> None:
        """Record the first crash of the current workers.

        Workers that had run at least :data:`STABLE_RUN_SECONDS` before the
        crash were not in a crash loop: the loop count starts again from 0, so
        a job that fails once a day is never given up on. (The same rule as
        the kubelet's ten minutes; tying it to ``backoff_max`` instead would
        reset the count on every crash of a job with a short backoff.)
        """
        if self.crashed:
            return
        if ran_seconds >= STABLE_RUN_SECONDS:
            self.crash_restarts = 0
        self.crashed, self.last_exit, self.message = True, code, message

    def current_state(self) -> str:
        """running, stopping, crashed, backoff, gave-up, exited or stopped."""
        if self.gave_up:
            return "gave-up"
        if self.stopping:
            return "stopping"
        alive = self.alive() > 0
        if self.crashed:
            return "backoff" if self.next_restart_at is not None and not alive else "crashed"
        if alive:
            return "running"
        if all(worker.exit_code == 0 for worker in self.workers):
            return "exited"
        return "stopped"

    def refresh_state(self, stamp: str) -> bool:
        """Update ``state`` (and ``since`` to ``stamp`` when it changed); True if it changed."""
        state = self.current_state()
        if state == self.state:
            return False
        self.state, self.since = state, stamp
        return True

    def view(self) -> JobView:
        """The planner's snapshot of this job."""
        return JobView(
            job=self.spec.job,
            fingerprint=self.fingerprint,
            alive=self.alive(),
            stopping=self.stopping,
            exit_codes=tuple(worker.exit_code for worker in self.workers),
            crash_restarts=self.crash_restarts,
            change_restarts=self.change_restarts,
            next_restart_at=self.next_restart_at,
            gave_up=self.gave_up,
            started_at=self.started_at,
            gpus=self.spec.gpus,
            device=self.spec.device,
            grace_seconds=self.spec.grace_seconds,
        )

    def record(self) -> dict[str, Any]:
        """What the loop publishes for this job (see ``Supervisor.records``)."""
        running = [w for w in self.workers if w.pid > 0 and w.exit_code is None]
        start_times = [procs.ticks_to_epoch(w.start_ticks) for w in running if w.start_ticks]
        return {
            "state": self.state or self.current_state(),
            "since": self.since,
            "pids": [w.pid for w in running],
            "start_times": [t for t in start_times if t is not None],
            "restarts": self.restarts,
            "crash_restarts": self.crash_restarts,
            "change_restarts": self.change_restarts,
            "last_exit": self.last_exit,
            "exit_codes": [w.exit_code for w in self.workers],
            "gpus": list(self.spec.gpus),
            "device": self.spec.device,
            "fallback_reason": self.spec.fallback_reason,
            "message": self.message,
            "fingerprint": self.fingerprint,
            "assignment_revision": self.spec.assignment_revision,
        }


_COUNTERS = ("crash_restarts", "change_restarts", "restarts")


def job_to_state(job: JobRuntime) -> dict[str, Any]:
    """The state-file entry of one job: enough to adopt its workers after ``kill -9``."""
    spec = job.spec
    return {
        "fingerprint": job.fingerprint,
        "spec": {
            "job": spec.job,
            "fingerprint": spec.fingerprint,
            "on_change": spec.on_change,
            "grace_seconds": spec.grace_seconds,
            "max_restarts": spec.max_restarts,
            "backoff_base": spec.backoff_base,
            "backoff_max": spec.backoff_max,
            "gpus": list(spec.gpus),
            "device": spec.device,
            "fallback_reason": spec.fallback_reason,
            "assignment_revision": spec.assignment_revision,
        },
        "workers": [_worker_to_state(worker) for worker in job.workers],
        **{name: getattr(job, name) for name in _COUNTERS},
        "started_at": job.started_at,
        "next_restart_at": job.next_restart_at,
        "gave_up": job.gave_up,
        "crashed": job.crashed,
        "last_exit": job.last_exit,
        "message": job.message,
        "state": job.state,
        "since": job.since,
    }


def _worker_to_state(worker: WorkerRuntime) -> dict[str, Any]:
    spec = worker.spec
    return {
        "index": spec.index,
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "cwd": spec.cwd,
        "gpus": list(spec.gpus),
        "device": spec.device,
        "pid": worker.pid,
        "pgid": worker.pgid,
        "start_ticks": worker.start_ticks,
        "exit_code": worker.exit_code,
        "group_gone": worker.group_gone,
        "error": worker.error,
    }


def job_from_state(entry: dict[str, Any]) -> JobRuntime:
    """Rebuild a job from its state-file entry; KeyError/TypeError/ValueError if malformed."""
    raw = entry["spec"]
    name = str(raw["job"])
    workers = [_worker_from_state(name, w) for w in entry["workers"]]
    spec = DesiredJob(
        job=name,
        state="run",
        workers=tuple(worker.spec for worker in workers),
        fingerprint=str(raw["fingerprint"]),
        on_change=str(raw["on_change"]),
        grace_seconds=float(raw["grace_seconds"]),
        max_restarts=int(raw["max_restarts"]),
        backoff_base=float(raw["backoff_base"]),
        backoff_max=float(raw["backoff_max"]),
        gpus=tuple(int(g) for g in raw["gpus"]),
        device=_device(raw["device"]),
        fallback_reason=raw.get("fallback_reason"),
        message="",
        assignment_revision=int(raw.get("assignment_revision", 0)),
    )
    job = JobRuntime(
        spec=spec,
        fingerprint=str(entry["fingerprint"]),
        workers=workers,
        started_at=float(entry["started_at"]),
    )
    for name_ in _COUNTERS:
        setattr(job, name_, int(entry.get(name_, 0)))
    next_at = entry.get("next_restart_at")
    job.next_restart_at = float(next_at) if next_at is not None else None
    job.gave_up = bool(entry.get("gave_up", False))
    job.crashed = bool(entry.get("crashed", False))
    last_exit = entry.get("last_exit")
    job.last_exit = int(last_exit) if last_exit is not None else None
    job.message = str(entry.get("message", ""))
    job.state, job.since = str(entry.get("state", "")), str(entry.get("since", ""))
    return job


def _worker_from_state(job: str, raw: dict[str, Any]) -> WorkerRuntime:
    pid = int(raw["pid"])
    if int(raw.get("pgid", pid)) != pid:
        raise ValueError(f"worker pid {pid} is not its group's leader")
    spec = WorkerSpec(
        job=job,
        index=int(raw["index"]),
        argv=tuple(str(a) for a in raw["argv"]),
        env={str(k): str(v) for k, v in raw["env"].items()},
        cwd=raw.get("cwd"),
        gpus=tuple(int(g) for g in raw["gpus"]),
        device=_device(raw["device"]),
    )
    ticks = raw.get("start_ticks")
    exit_code = raw.get("exit_code")
    return WorkerRuntime(
        spec=spec,
        pid=pid,
        start_ticks=int(ticks) if ticks is not None else None,
        exit_code=int(exit_code) if exit_code is not None else None,
        group_gone=bool(raw.get("group_gone", False)),
        error=str(raw.get("error", "")),
    )


def _device(value: object) -> Device:
    if value == "cuda":
        return "cuda"
    if value == "cpu":
        return "cpu"
    raise ValueError(f"unknown device {value!r}")


STATE_SCHEMA_VERSION = 1


class StateFileError(Exception):
    """The supervisor's state file exists but cannot be used."""


def write_state_file(path: Path, jobs: Mapping[str, JobRuntime]) -> None:
    """Atomically rewrite the state file with every tracked job (OSError on failure)."""
    data = {
        "schema_version": STATE_SCHEMA_VERSION,
        "agent_pid": os.getpid(),
        "jobs": {name: job_to_state(job) for name, job in sorted(jobs.items())},
    }
    procs.write_json_atomic(path, data)


def read_state_file(path: Path) -> dict[str, Any]:
    """The recorded jobs by name ({} when there is no file); StateFileError if unusable."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateFileError(str(exc)) from exc
    if not isinstance(data, dict) or data.get("schema_version") != STATE_SCHEMA_VERSION:
        raise StateFileError("unknown format or schema_version")
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        raise StateFileError("no jobs table")
    return jobs


def poll_leader(worker: WorkerRuntime) -> int | None:
    """Poll a main process that may not be our child: None while it runs, else its exit code."""
    stat = procs.read_stat(worker.pid)
    same = stat is not None and worker.start_ticks in (None, stat.start_ticks)
    if stat is None or not same:
        return procs.UNKNOWN_EXIT
    if stat.state != "Z":
        return None
    if stat.ppid == os.getpid():
        return None  # our own zombie: reap_group collects its status on the next tick
    if stat.exit_status is None:
        return procs.UNKNOWN_EXIT
    try:  # a zombie's /proc entry still holds its wait status (Linux >= 3.5)
        return procs.exit_code_of(stat.exit_status)
    except ValueError:
        return procs.UNKNOWN_EXIT


def classify_recorded(worker: WorkerRuntime) -> str:
    """Classify a worker read back from the state file, updating it in place.

    Returns ``adopted`` (same pid and start time: still ours), ``reused``
    (the pid is another process now), ``gone`` (nothing left) or ``orphans``
    (main process gone, group members left), or ``exited`` (known before).
    """
    if worker.pid <= 0 or worker.group_gone:
        worker.group_gone = True
        return "exited"
    stat = procs.read_stat(worker.pid)
    same = stat is not None and worker.start_ticks in (None, stat.start_ticks)
    if stat is not None and not same:
        # The pid now names another process: leave it and its group alone.
        worker.exit_code = procs.UNKNOWN_EXIT if worker.exit_code is None else worker.exit_code
        worker.group_gone = True
        return "reused"
    if same and worker.exit_code is None:
        worker.adopted = True  # running (or a zombie whose status tick() collects)
        return "adopted"
    worker.exit_code = procs.UNKNOWN_EXIT if worker.exit_code is None else worker.exit_code
    # The main process is gone; a live group with its id can only be its orphans.
    worker.group_gone = not procs.group_alive(worker.pgid)
    return "gone" if worker.group_gone else "orphans"
