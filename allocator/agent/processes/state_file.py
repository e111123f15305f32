"""The supervisor's state file: every tracked job, enough to adopt its workers after ``kill -9``.

Rewritten atomically (temporary file, rename; mode 0600, since the
recorded environments may hold secrets) whenever anything in it changes,
and once more *before* a worker is launched: a restarted agent then knows
the shim's status file even if it died between the fork and the next save.
It is not fsynced: it is written on the path of every stop and start, and
it describes processes, which a crash of the machine ends too; against a
crash of the agent (``kill -9``), the rename is what counts (the page cache
outlives the process).
New fields are optional, so a file written by an older agent (workers
without a shim) still reads, and its workers are still adopted.

Version 2 records the boot it was written on (``boot_id``): a pid and its
start ticks name one process only within one boot, so a file from another
boot, or one this agent cannot use (cut short, or written by a newer agent),
is refused whole (:class:`StateFileError`) and the supervisor adopts from
the shims' own status files instead, never by killing what runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from allocator.agent.kernel import procs
from allocator.agent.planning.job_phase import JobPhase
from allocator.agent.planning.types import DesiredJob, Device, WorkerSpec
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime

__all__ = [
    "STATE_SCHEMA_VERSION",
    "StateFileError",
    "job_from_state",
    "job_to_state",
    "read_state_file",
    "write_state_file",
]

#: 2: the boot id; 1 (still read): none, so its pids are trusted with their start ticks.
STATE_SCHEMA_VERSION = 2
_READABLE_VERSIONS = (1, 2)

_COUNTERS = ("crash_restarts", "change_restarts", "restarts")


class StateFileError(Exception):
    """The supervisor's state file exists but cannot be used."""


def job_to_state(job: JobRuntime) -> dict[str, Any]:
    """The state-file entry of one job."""
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
        "phase": job.phase.value,
        **_legacy_flags(job),
        "started_at": job.started_at,
        "killed_at": job.killed_at,
        "next_restart_at": job.next_restart_at,
        "retry_at": job.retry_at,
        "stop_deadline": job.stop_deadline,
        "stop_reason": job.stop_reason,
        "last_exit": job.last_exit,
        "release_on_exit": job.release_on_exit,
        "message": job.message,
        "state": job.state,
        "since": job.since,
    }


def _legacy_flags(job: JobRuntime) -> dict[str, bool]:
    """The phase as the flags an agent before phases wrote (so it can still adopt the jobs)."""
    phase = job.phase
    return {
        "gave_up": phase is JobPhase.GAVE_UP,
        "crashed": job.crash_noted,
        "stopping": phase.stopping,
        "killed": job.killed_at is not None,
        "stopped": phase is JobPhase.STOPPED,
    }


def _phase_from_flags(entry: Mapping[str, Any]) -> JobPhase:
    """The phase of a job an agent before phases recorded as flags."""
    crashed = bool(entry.get("crashed", False))
    if entry.get("gave_up"):
        return JobPhase.GAVE_UP
    if entry.get("stopping"):
        return JobPhase.CLEARING if crashed else JobPhase.STOPPING
    if crashed:
        return JobPhase.CRASHED if entry.get("next_restart_at") is None else JobPhase.BACKOFF
    return JobPhase.STOPPED if entry.get("stopped") else JobPhase.RUNNING


def _worker_to_state(worker: WorkerRuntime) -> dict[str, Any]:
    spec = worker.spec
    return {
        "index": spec.index,
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "cwd": spec.cwd,
        "gpus": list(spec.gpus),
        "device": spec.device,
        "user": spec.user,
        "group": spec.group,
        "pid": worker.pid,
        "pgid": worker.pgid,
        "start_ticks": worker.start_ticks,
        "status_path": worker.status_path,
        "cgroup": worker.cgroup,
        "main_pid": worker.main_pid,
        "main_ticks": worker.main_ticks,
        "exit_code": worker.exit_code,
        "shim_code": worker.shim_code,
        "stop_sent": worker.stop_sent,
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
    for counter in _COUNTERS:
        setattr(job, counter, int(entry.get(counter, 0)))
    job.phase = JobPhase(entry["phase"]) if "phase" in entry else _phase_from_flags(entry)
    job.next_restart_at = _optional_float(entry.get("next_restart_at"))
    job.retry_at = _optional_float(entry.get("retry_at"))
    job.stop_deadline = _optional_float(entry.get("stop_deadline"))
    job.killed_at = _optional_float(entry.get("killed_at"))
    if job.killed_at is None and entry.get("killed"):  # written before killed_at was
        job.killed_at = job.stop_deadline  # SIGKILL went out once the grace was over
    job.stop_reason = str(entry.get("stop_reason", ""))
    job.last_exit = _optional_int(entry.get("last_exit"))
    job.release_on_exit = entry.get("release_on_exit") is True  # its GPUs still to release
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
        user=_optional_str(raw.get("user")),
        group=_optional_str(raw.get("group")),
    )
    return WorkerRuntime(
        spec=spec,
        pid=pid,
        start_ticks=_optional_int(raw.get("start_ticks")),
        status_path=str(raw.get("status_path") or ""),
        cgroup=str(raw.get("cgroup") or ""),
        main_pid=int(raw.get("main_pid") or 0),
        main_ticks=_optional_int(raw.get("main_ticks")),
        exit_code=_optional_int(raw.get("exit_code")),
        shim_code=_optional_int(raw.get("shim_code")),
        stop_sent=bool(raw.get("stop_sent", False)),
        group_gone=bool(raw.get("group_gone", False)),
        error=str(raw.get("error", "")),
    )


def _optional_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _device(value: object) -> Device:
    if value == "cuda":
        return "cuda"
    if value == "cpu":
        return "cpu"
    raise ValueError(f"unknown device {value!r}")


def write_state_file(path: Path, jobs: Mapping[str, JobRuntime], boot_id: str = "") -> None:
    """Atomically rewrite the state file with every tracked job (OSError on failure)."""
    data = {
        "schema_version": STATE_SCHEMA_VERSION,
        "agent_pid": os.getpid(),
        "boot_id": boot_id,
        "jobs": {name: job_to_state(job) for name, job in sorted(jobs.items())},
    }
    procs.write_json_atomic(path, data, durable=False)


def read_state_file(path: Path, boot_id: str = "") -> dict[str, Any]:
    """The recorded jobs by name ({} when there is no file); StateFileError if unusable.

    Unusable: not JSON (cut short), a ``schema_version`` this agent does not
    know (a newer agent wrote it), or written on another boot than ``boot_id``.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise StateFileError(f"cannot read it: {exc}") from exc
    if not isinstance(data, dict):
        raise StateFileError("not a state file")
    version = data.get("schema_version")
    if version not in _READABLE_VERSIONS:
        raise StateFileError(
            f"schema_version {version!r} is not one this agent reads "
            f"({', '.join(map(str, _READABLE_VERSIONS))}): written by another agent version"
        )
    written_on = data.get("boot_id") or ""
    if written_on and boot_id and written_on != boot_id:
        raise StateFileError(f"written on another boot ({written_on}): its pids name nothing now")
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        raise StateFileError("no jobs table")
    return jobs
