"""Every field of a tracked job survives the state file, or is named here as not kept.

A field the state file drops is a fact a restarted agent no longer has
(a ``release_on_exit`` still to act on, a stop under way, a crash count):
each field below gets a value unlike its default, goes through JSON and
back, and must come back equal. A field added later fails here until it is
written and read, or listed as not kept with the reason.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from allocator.agent.planning.job_phase import JobPhase
from allocator.agent.planning.types import DesiredJob, WorkerSpec
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime
from allocator.agent.processes.state_file import job_from_state, job_to_state

# Not kept, and why: each is rebuilt from elsewhere after a restart.
_JOB_NOT_KEPT = {
    "workers": "compared worker by worker below",
    "spec": "compared field by field below",
    "last_kill_pass": "the pace of SIGKILL passes; a restarted agent starts a new pass",
    "output_tail": "read again from the log when the job is given up on",
    "log_path": "read again from the log when the job is given up on",
}
_SPEC_NOT_KEPT = {
    "state": "a recorded job is one that runs",
    "message": "the planner's words, made anew from the desired job",
    "workers": "the workers' own specs, compared below",
    "fault": "the desired job's, made anew from the GPUs' health",
    "restart": "the desired job's, made anew from the policy",
    "release_on_exit": "the desired job's statuses, made anew from the policy",
}
_WORKER_NOT_KEPT = {
    "spec": "compared field by field below",
    "popen": "a handle of the agent that started it: no process's after a restart",
    "adopted": "what the agent that reads the file decides",
    "status_seen": "the reading agent reads the status file afresh",
    "strays": "children of the agent that died: the new one is not their parent",
}
_WORKER_SPEC_NOT_KEPT = {
    "cpus": "applied at launch: a running process keeps its pinning",
    "mems": "applied at launch: a running process keeps its memory binding",
    "container": "its name and engine are in the shim's status file",
}


def _changed(value: Any, name: str) -> Any:
    """A value of the field's kind unlike ``value`` (so a dropped field reads back different)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return value + 2.5
    if isinstance(value, str):
        return f"{value}-{name}"
    if value is None:
        return sum(map(ord, name))  # one number per field: no two read back into each other
    raise AssertionError(f"no changed value for {name}={value!r}")


def _worker_spec() -> WorkerSpec:
    return WorkerSpec(
        "train",
        1,
        ("python", "train.py"),
        {"ALLOCATOR_GPUS": "2,3"},
        "/srv",
        (2, 3),
        "cuda",
        user="alice",
        group="lab",
        cpus=(4, 5),
        mems=(1,),
    )


def _worker() -> WorkerRuntime:
    worker = WorkerRuntime(_worker_spec(), pid=4321, start_ticks=99)
    for field in dataclasses.fields(WorkerRuntime):
        if field.name in _WORKER_NOT_KEPT or field.name in ("pid", "start_ticks"):
            continue
        setattr(worker, field.name, _changed(getattr(worker, field.name), field.name))
    return worker


def _job() -> JobRuntime:
    worker = _worker()
    spec = DesiredJob(
        job="train",
        state="run",
        workers=(worker.spec,),
        fingerprint="f" * 64,
        on_change="signal:SIGUSR1",
        grace_seconds=12.5,
        max_restarts=4,
        backoff_base=1.5,
        backoff_max=30.0,
        gpus=(2, 3),
        device="cuda",
        fallback_reason="gpu 2 failed",
        message="",
        assignment_revision=812,
    )
    job = JobRuntime(spec=spec, fingerprint="e" * 64, started_at=5.0, workers=[worker])
    job.phase = JobPhase.FINISHED
    for field in dataclasses.fields(JobRuntime):
        if field.name in _JOB_NOT_KEPT or field.name in ("fingerprint", "started_at", "phase"):
            continue
        setattr(job, field.name, _changed(getattr(job, field.name), field.name))
    return job


def _through_file(job: JobRuntime) -> JobRuntime:
    return job_from_state(json.loads(json.dumps(job_to_state(job))))


def _kept(cls: type[Any], not_kept: dict[str, str]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.name not in not_kept]


@pytest.mark.parametrize("name", _kept(JobRuntime, _JOB_NOT_KEPT))
def test_every_job_field_survives_the_state_file(name: str) -> None:
    job = _job()
    assert getattr(_through_file(job), name) == getattr(job, name), name


@pytest.mark.parametrize("name", _kept(DesiredJob, _SPEC_NOT_KEPT))
def test_every_spec_field_survives_the_state_file(name: str) -> None:
    job = _job()
    assert getattr(_through_file(job).spec, name) == getattr(job.spec, name), name


@pytest.mark.parametrize("name", _kept(WorkerRuntime, _WORKER_NOT_KEPT))
def test_every_worker_field_survives_the_state_file(name: str) -> None:
    job = _job()
    assert getattr(_through_file(job).workers[0], name) == getattr(job.workers[0], name), name


@pytest.mark.parametrize("name", _kept(WorkerSpec, _WORKER_SPEC_NOT_KEPT))
def test_every_worker_spec_field_survives_the_state_file(name: str) -> None:
    job = _job()
    read = _through_file(job).workers[0].spec
    assert getattr(read, name) == getattr(job.workers[0].spec, name), name


def test_the_values_differ_from_the_defaults() -> None:
    """The check above means something only if no field keeps its default value."""
    job, plain = _job(), JobRuntime(spec=_job().spec, fingerprint="", started_at=0.0)
    same = [
        name
        for name in _kept(JobRuntime, _JOB_NOT_KEPT)
        if getattr(job, name) == getattr(plain, name)
    ]
    assert same == []
