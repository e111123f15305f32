"""A desired job made from its policy job, its assignment and what was decided for it."""

from __future__ import annotations

from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import DesiredJob, DesiredState, Device, WorkerSpec
from allocator.policy.model import Job
from allocator.records.types import Assignment

__all__ = ["not_running", "outcome"]


def not_running(
    job: Job,
    assignment: Assignment,
    revision: int,
    state: DesiredState,
    message: str,
    fault: str | None = None,
) -> DesiredJob:
    """A job that runs no worker of ours: waiting, failed, refused or held by another process."""
    device: Device = "cpu" if assignment.mode == "cpu" else "cuda"
    return outcome(job, assignment, revision, state, message, (), device, fault)


def outcome(
    job: Job,
    assignment: Assignment,
    revision: int,
    state: DesiredState,
    message: str,
    workers: tuple[WorkerSpec, ...],
    device: Device,
    fault: str | None = None,
) -> DesiredJob:
    """The desired job: ``state`` and ``workers`` with the job's restart settings."""
    return DesiredJob(
        job=assignment.job,
        state=state,
        workers=workers,
        fingerprint=fingerprint(workers),
        on_change=job.on_change,
        grace_seconds=job.grace_seconds,
        max_restarts=job.max_restarts,
        backoff_base=job.restart_backoff_seconds,
        backoff_max=job.restart_backoff_max_seconds,
        gpus=assignment.gpus,
        device=device,
        fallback_reason=assignment.fallback_reason if device == "cpu" else None,
        message=message,
        assignment_revision=revision,
        fault=fault,
        restart=job.restart,
        release_on_exit=job.release_on_exit,
    )
