"""Plain frozen data shared by the agent's parts.

``desired`` turns policy and assignments into :class:`DesiredJob` values, the
supervisor reports each running job as a :class:`JobView`, and ``reconcile``
compares the two and returns :data:`Action` values for the supervisor to carry out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from allocator.agent.planning.containers import ContainerRun
from allocator.agent.planning.job_phase import JobState

__all__ = [
    "Accept",
    "Action",
    "Confirm",
    "DesiredJob",
    "DesiredState",
    "Device",
    "Finish",
    "Forget",
    "GiveUp",
    "IdleRelease",
    "JobView",
    "Pin",
    "ScheduleRestart",
    "SignalJob",
    "Start",
    "StartCause",
    "Stop",
    "WorkerExit",
    "WorkerSpec",
]

Device = Literal["cuda", "cpu"]
DesiredState = Literal["run", "wait", "failed", "refused", "undeclared"]
StartCause = Literal["new", "change", "crash"]
RestartRule = Literal["always", "on-failure", "never"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything needed to start one worker process of a job."""

    job: str
    index: int  # 0 for single; local rank in per-gpu mode
    argv: tuple[str, ...]
    env: Mapping[str, str]  # overlay: policy job.env, then the allocator's variables on top
    cwd: str | None
    gpus: tuple[int, ...]  # physical indices this worker sees
    device: Device
    user: str | None = None  # the policy's job.user: run as this user (None: as the agent)
    group: str | None = None  # the policy's job.group (None: the user's primary group)
    cpus: tuple[int, ...] = ()  # pin the worker to these CPUs (): unpinned; not fingerprinted
    mems: tuple[int, ...] = ()  # bind its memory to these NUMA nodes (where numactl is)
    container: ContainerRun | None = None  # run as this container (None: a host process)


@dataclass(frozen=True, slots=True)
class DesiredJob:
    """What the agent wants for one job on this host; only state "run" has workers."""

    job: str
    state: DesiredState
    workers: tuple[WorkerSpec, ...]
    fingerprint: str  # sha256 over every worker's argv, env, cwd
    on_change: str  # "restart" | "none" | "signal:SIGUSR1" ...
    grace_seconds: float
    max_restarts: int
    backoff_base: float
    backoff_max: float
    gpus: tuple[int, ...]
    device: Device
    fallback_reason: str | None
    message: str  # why wait/failed/refused/undeclared; "" when running normally
    assignment_revision: int
    # Why this host's own GPUs cannot serve the job now (its fallback is at work
    # because of them); a job across hosts' other shares follow it.
    fault: str | None = None
    restart: RestartRule = "on-failure"  # when workers that ended by themselves start again
    release_on_exit: tuple[int, ...] = ()  # the exit statuses at which its GPUs are released


@dataclass(frozen=True, slots=True)
class Pin:
    """A job held in its fallback by the flap limit: treat ``unhealthy`` as out for it;
    ``note`` says why (see :mod:`allocator.agent.gpu_care.hold_down`)."""

    unhealthy: Mapping[int, str]
    note: str


@dataclass(frozen=True, slots=True)
class JobView:
    """The supervisor's snapshot of one job it tracks, input to ``plan``.

    ``phase`` is where the supervisor's transition table has the job, as one
    record per phase carrying that phase's own timer (see
    :func:`~allocator.agent.planning.job_phase.phase_record`).
    """

    job: str
    fingerprint: str  # of the spec its workers run (or accepted via on_change none/signal)
    alive: int  # workers whose process group still has live processes
    phase: JobState
    exit_codes: tuple[int | None, ...]  # per worker: None = running; 128+N for signal N
    crash_restarts: int
    change_restarts: int
    gpus: tuple[int, ...] = field(default=())  # GPUs the running workers were started on
    device: Device = "cuda"  # device the running workers were started on
    grace_seconds: float = 10.0  # of the spec they were started with; stops an undeclared job
    exit_status: int | None = None  # the first crash's code, when one is noted
    assignment_revision: int = 0  # of the assignment its workers last ran under (Confirm)


@dataclass(frozen=True, slots=True)
class Start:
    """Start the job's workers from ``spec`` (the old group is entirely gone)."""

    job: str
    spec: DesiredJob
    cause: StartCause


@dataclass(frozen=True, slots=True)
class Stop:
    """Gracefully stop every worker group of the job: SIGTERM, then SIGKILL after grace."""

    job: str
    reason: str
    grace_seconds: float


@dataclass(frozen=True, slots=True)
class SignalJob:
    """Send ``signum`` to the job's workers and record ``fingerprint`` as accepted."""

    job: str
    signum: int
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Accept:
    """Record ``fingerprint`` as accepted without touching the workers (on_change none)."""

    job: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Confirm:
    """Record that the running workers now serve assignment ``revision`` (set again, same spec).

    A finished job runs again only when set anew after it finished; the
    revision its workers last ran under, kept in the state file, says when.
    """

    job: str
    revision: int


@dataclass(frozen=True, slots=True)
class ScheduleRestart:
    """Record that a crash restart of the job is due at monotonic time ``at``."""

    job: str
    at: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop restarting the job: the crash-loop limit was reached."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The job's workers all ended and it is done: no restart; ``release`` its GPUs or not."""

    job: str
    status: int  # the job's exit status (a crash's code, else 0)
    release: bool  # the status is one of the job's release_on_exit statuses
    reason: str  # what the history and the worker record say: ``finished (exit 0)``


@dataclass(frozen=True, slots=True)
class Forget:
    """Drop the job's runtime: nothing is left to track."""

    job: str


Action = Start | Stop | SignalJob | Accept | Confirm | ScheduleRestart | GiveUp | Finish | Forget


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """One worker's main process ended: its exit code (128+N for signal N), and whether a crash."""

    job: str
    index: int
    pid: int
    exit_code: int
    crash: bool
    message: str


@dataclass(frozen=True, slots=True)
class IdleRelease:
    """Release ``job`` from this host if its assignment is still at ``revision``.

    ``kind`` says what decided it (``idle``, or ``exit`` for a job whose
    ``release_on_exit`` status ended it); it names the release's log events.
    """

    job: str
    revision: int
    reason: str
    kind: str = "idle"
