"""The supervisor's mutable bookkeeping per job and worker.

Kept apart from :mod:`allocator.agent.processes.supervisor` (which does the process
I/O) so the counting rules read on their own; the state-file form is in
:mod:`allocator.agent.processes.state_file`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.agent.kernel import procs
from allocator.agent.planning.containers import cid_path
from allocator.agent.planning.job_phase import (
    JobEvent,
    JobPhase,
    next_phase,
    phase_record,
    published_state,
)
from allocator.agent.planning.types import DesiredJob, JobView, WorkerSpec

__all__ = ["STABLE_RUN_SECONDS", "JobRuntime", "WorkerRuntime"]


STABLE_RUN_SECONDS = 600.0

# The phases in which the current workers' first crash is what the job shows.
_AFTER_CRASH = (JobPhase.CRASHED, JobPhase.BACKOFF, JobPhase.CLEARING, JobPhase.GAVE_UP)


@dataclass(slots=True)
class WorkerRuntime:
    """One worker: its shim (which leads the worker's session and process group) and its tree.

    ``pid`` is the shim's; the worker's main process is ``main_pid`` once the
    shim reported it. A worker recorded by an agent that started workers
    without a shim has no ``status_path``: then ``pid`` is the main process.
    """

    spec: WorkerSpec
    pid: int  # 0: not started (yet, or ever: ``error`` says why)
    start_ticks: int | None  # /proc start time: with the pid, names exactly one process
    popen: subprocess.Popen[bytes] | None = None  # None when adopted or never started
    status_path: str = ""  # the shim's status file: the exit status outlives the agent
    cgroup: str = ""  # the worker's own cgroup, when the agent could make one
    main_pid: int = 0
    main_ticks: int | None = None
    exit_code: int | None = None  # of the main process; 128+N for signal N
    shim_code: int | None = None  # the shim's own exit status, once reaped
    stop_sent: bool = False  # we asked it to stop, so its exit is not a crash
    group_gone: bool = False  # nothing of its process tree is left (reaped and checked)
    adopted: bool = False
    error: str = ""
    status_seen: tuple[int, int] | None = None  # the status file version last read
    # Processes of the tree that came to the agent after the shim died (pid -> start
    # time), to be reaped by pid: they may be in no group of the worker's.
    strays: dict[int, int] = field(default_factory=dict)

    @property
    def pgid(self) -> int:
        """The process group id: the shim started a new session, so its own pid."""
        return self.pid

    @property
    def shim(self) -> bool:
        """Whether the worker runs under a shim (every worker this agent starts does)."""
        return bool(self.status_path)

    @property
    def shown_pid(self) -> int:
        """The pid users care about: the worker's main process (0 while not known)."""
        return self.main_pid if self.shim else self.pid


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
    phase: JobPhase = JobPhase.RUNNING  # moved only by ``move`` (see job_phase)
    next_restart_at: float | None = None
    retry_at: float | None = None  # WAITING: when the start that could not be recorded is retried
    stop_deadline: float | None = None
    stop_reason: str = ""
    killed_at: float | None = None  # when the first SIGKILL pass of the current stop went out
    last_kill_pass: float | None = None
    last_exit: int | None = None
    message: str = ""
    output_tail: tuple[str, ...] = ()  # the failed worker's last lines, once given up on
    log_path: str = ""  # the log they come from
    release_on_exit: bool = False  # FINISHED with a status its rule releases the GPUs at
    state: str = ""  # the published state, kept to see when it changes (``since``)
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

    def move(self, event: JobEvent) -> bool:
        """Apply ``event`` by the transition table; False (phase kept) when it refuses it."""
        phase = next_phase(self.phase, event)
        if phase is None:
            return False
        self.phase = phase
        return True

    @property
    def crash_noted(self) -> bool:
        """Whether a crash of the current workers decides what is shown (its exit code stays)."""
        return self.phase in _AFTER_CRASH

    def begin_stop(self, deadline: float, reason: str) -> None:
        """A stop starts (the move to a stopping phase is made): no exit from now is a crash."""
        for worker in self.workers:
            if worker.exit_code is None:
                worker.stop_sent = True  # its exit is ours, not a crash
        self.stop_deadline, self.stop_reason = deadline, reason
        self.killed_at, self.last_kill_pass = None, None

    def accept(self, fingerprint: str) -> None:
        """A new spec taken on without a restart ends a crash loop's verdict: it may fix it."""
        self.fingerprint = fingerprint
        self.crash_restarts, self.next_restart_at = 0, None

    def confirm(self, revision: int) -> None:
        """The running workers serve assignment ``revision`` now (it was set again, same spec)."""
        self.spec = replace(self.spec, assignment_revision=revision)

    def give_up(self, reason: str) -> None:
        """The crash-loop limit was reached (the move to GAVE_UP is made): say why."""
        # Keep what the workers said (a user that does not exist, a missing command):
        # the planner's reason only knows their exit codes.
        errors = [w.error for w in self.workers if w.error]
        self.next_restart_at, self.message = None, "; ".join([*errors[:1], reason])

    def finish(self, status: int, reason: str, release: bool) -> None:
        """The job is done (the move to FINISHED is made): say how it ended, and what follows."""
        self.next_restart_at, self.last_exit, self.message = None, status, reason
        self.release_on_exit = release

    def hold(self, why: str, retry_at: float) -> None:
        """Nothing was launched (the move to WAITING is made): say why, and when it is retried."""
        for worker in self.workers:
            worker.group_gone = True  # never started: nothing of it to wait for
        self.retry_at, self.message = retry_at, f"not started: {why}"

    def note_crash(self, code: int, message: str, ran_seconds: float) -> None:
        """Record the first crash of the current workers (the move to CRASHED comes first).

        Workers that had run at least :data:`STABLE_RUN_SECONDS` before the
        crash were not in a crash loop: the loop count starts again from 0, so
        a job that fails once a day is never given up on. (The same rule as
        the kubelet's ten minutes; tying it to ``backoff_max`` instead would
        reset the count on every crash of a job with a short backoff.)
        """
        if ran_seconds >= STABLE_RUN_SECONDS:
            self.crash_restarts = 0
        self.last_exit, self.message = code, message

    def current_state(self) -> str:
        """running, stopping, crashed, backoff, gave-up, waiting, exited or stopped."""
        return published_state(
            self.phase, self.alive(), [worker.exit_code for worker in self.workers]
        )

    def refresh_state(self, stamp: str) -> bool:
        """Update ``state`` (and ``since`` to ``stamp`` when it changed); True if it changed."""
        state = self.current_state()
        if state == self.state:
            return False
        self.state, self.since = state, stamp
        return True

    def tree_roots(self) -> tuple[tuple[int, int | None, str, str], ...]:
        """Each live worker's tree root: (shim pid, start ticks, cgroup or "", cidfile or "").

        Everything below a root (the shim is a child subreaper), in its
        cgroup (see :mod:`allocator.agent.processes.tree`) or in its
        container (the id the engine wrote to the cidfile) is the job's.
        """
        return tuple(
            (w.pid, w.start_ticks, w.cgroup, _cidfile(w))
            for w in self.workers
            if w.pid > 0 and not w.group_gone
        )

    def view(self) -> JobView:
        """The planner's snapshot of this job."""
        alive = self.alive()
        phase = phase_record(
            self.phase,
            alive=alive,
            started_at=self.started_at,
            stop_deadline=self.stop_deadline,
            restart_at=self.next_restart_at,
            retry_at=self.retry_at,
        )
        return JobView(
            job=self.spec.job,
            fingerprint=self.fingerprint,
            alive=alive,
            phase=phase,
            exit_codes=tuple(worker.exit_code for worker in self.workers),
            crash_restarts=self.crash_restarts,
            change_restarts=self.change_restarts,
            gpus=self.spec.gpus,
            device=self.spec.device,
            grace_seconds=self.spec.grace_seconds,
            exit_status=self.last_exit if self.crash_noted else None,
            assignment_revision=self.spec.assignment_revision,
        )

    def record(self) -> dict[str, Any]:
        """What the loop publishes for this job as its WorkerRecord.

        ``restarts`` counts every restart of the job (change and crash);
        ``crash_restarts`` counts crash restarts since the last change/new
        start (the number the crash-loop limit applies to). ``start_times``
        are seconds since the epoch; ``state`` is one of running, stopping,
        crashed, backoff, gave-up, waiting, exited, stopped (see :func:`published_state`).
        """
        running = [w for w in self.workers if w.shown_pid > 0 and w.exit_code is None]
        ticks = [w.main_ticks if w.shim else w.start_ticks for w in running]
        start_times = [procs.ticks_to_epoch(t) for t in ticks if t]
        return {
            "state": self.state or self.current_state(),
            "since": self.since,
            "pids": [w.shown_pid for w in running],
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
            "output_tail": list(self.output_tail),
            "log_path": self.log_path,
        }


def _cidfile(worker: WorkerRuntime) -> str:
    """Where a containerised worker's engine writes its container id ("" for a host worker)."""
    return cid_path(worker.status_path) if worker.spec.container and worker.status_path else ""
