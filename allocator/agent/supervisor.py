"""The agent's process supervisor: carries out planned actions on real processes.

``plan()`` decides; the :class:`Supervisor` does. It starts each worker in
its own session and process group with its environment fixed before exec,
stops a job by signalling whole groups (SIGTERM, a grace period, SIGKILL),
reaps every exit, counts crashes apart from change restarts, and keeps a
state file so that an agent restarted after ``kill -9`` adopts the workers
still running instead of starting duplicates.

Nothing here blocks for a grace period: :meth:`Supervisor.apply` sends
signals and records deadlines, :meth:`Supervisor.tick` (called by the loop
every few hundred milliseconds) reaps, escalates overdue stops and notices
groups that are gone. Only :meth:`Supervisor.stop_all` waits, for shutdown.

The agent makes itself a child subreaper (see :func:`procs.become_subreaper`):
grandchildren orphaned by a dying worker are reparented to the agent, which
reaps them; otherwise zombies left to init would make a group look alive.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from allocator.agent import procs
from allocator.agent.model import (
    Accept,
    Action,
    DesiredJob,
    Forget,
    GiveUp,
    JobView,
    ScheduleRestart,
    SignalJob,
    Start,
    Stop,
    WorkerSpec,
)
from allocator.agent.procs import clean_base_env
from allocator.agent.runtime import (
    JobRuntime,
    StateFileError,
    WorkerRuntime,
    classify_recorded,
    job_from_state,
    poll_leader,
    read_state_file,
    write_state_file,
)
from allocator.identity import format_time, utc_now

__all__ = ["AdoptReport", "AdoptedWorker", "Logger", "Supervisor", "WorkerExit", "clean_base_env"]

Logger = Callable[[str, dict[str, Any]], None]

_STOP_POLL_SECONDS = 0.02
_KILL_WAIT_SECONDS = 10.0  # after SIGKILL, how long stop_all waits for the kernel to finish


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
class AdoptedWorker:
    """What adopt() decided for one recorded worker: adopted, gone, reused or orphans."""

    job: str
    index: int
    pid: int
    outcome: str


@dataclass(frozen=True, slots=True)
class AdoptReport:
    """Jobs adopted from the state file (tracked again) and stale ones (forgotten)."""

    adopted: tuple[str, ...]
    stale: tuple[str, ...]
    workers: tuple[AdoptedWorker, ...]


def _log_to_logging(event: str, fields: dict[str, Any]) -> None:
    logging.getLogger("allocator.agent").info("%s %s", event, fields)


class Supervisor:
    """Starts, stops, reaps and adopts the worker processes of this host's jobs."""

    def __init__(
        self,
        log_dir: Path,
        state_file: Path,
        *,
        base_env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
        logger: Logger | None = None,
        subreaper: bool = True,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.state_file = Path(state_file)
        self._base_env = clean_base_env(os.environ if base_env is None else base_env)
        self._clock = clock
        self._wall = wall
        self._log: Logger = logger or _log_to_logging
        self._jobs: dict[str, JobRuntime] = {}
        self._pending_exits: list[WorkerExit] = []
        self._dirty = False
        # See the module docstring: orphaned grandchildren must come to us to be reaped.
        self.subreaper = procs.become_subreaper() if subreaper else False

    # --- snapshots ----------------------------------------------------------------

    def views(self) -> dict[str, JobView]:
        """Snapshot of every tracked job for ``plan()`` (call :meth:`tick` first)."""
        return {name: job.view() for name, job in sorted(self._jobs.items())}

    def records(self) -> dict[str, dict[str, Any]]:
        """Per job what the loop publishes as a WorkerRecord.

        ``restarts`` counts every restart of the job (change and crash);
        ``crash_restarts`` counts crash restarts since the last change/new
        start (the number the crash-loop limit applies to). ``start_times``
        are seconds since the epoch; ``state`` is one of running, stopping,
        crashed, backoff, gave-up, exited, stopped.
        """
        return {name: job.record() for name, job in sorted(self._jobs.items())}

    # --- actions --------------------------------------------------------------------

    def apply(self, action: Action) -> None:
        """Carry out one planned action; never waits for a grace period, never raises for it."""
        if isinstance(action, Start):
            self._start(action)
        elif isinstance(action, Stop):
            self._stop(action.job, action.reason, action.grace_seconds)
        elif isinstance(action, SignalJob):
            self._signal(action)
        elif isinstance(action, Accept):
            self._accept(action.job, action.fingerprint)
        elif isinstance(action, ScheduleRestart):
            self._schedule(action)
        elif isinstance(action, GiveUp):
            self._give_up(action)
        elif isinstance(action, Forget):
            self._forget(action.job)
        self._settle()

    def _start(self, action: Start) -> None:
        old = self._jobs.get(action.job)
        if old is not None and old.alive() > 0:
            # Never two copies: the planner waits for the old groups, this is the backstop.
            self._log("start-refused", {"job": action.job, "reason": "old workers still alive"})
            return
        spec = action.spec
        if spec.state != "run" or not spec.workers:
            self._log(
                "start-refused", {"job": action.job, "reason": f"nothing to run ({spec.state})"}
            )
            return
        job = JobRuntime(spec=spec, fingerprint=spec.fingerprint, started_at=self._clock())
        if old is not None:
            job.inherit_counters(old)
        job.count_start(action.cause)
        job.workers = [self._spawn(spec, worker, action.cause) for worker in spec.workers]
        self._jobs[action.job] = job
        self._dirty = True
        for worker in job.workers:
            if worker.exit_code is not None:  # could not even start: an immediate crash
                self._pending_exits.append(self._exited(job, worker, worker.exit_code))

    def _spawn(self, spec: DesiredJob, worker: WorkerSpec, cause: str) -> WorkerRuntime:
        name = f"{worker.job}.log" if len(spec.workers) == 1 else f"{worker.job}.{worker.index}.log"
        log_path = self.log_dir / name
        header = (
            f"--- allocator {format_time(self._wall())}: starting job {worker.job} worker "
            f"{worker.index} ({cause}) gpus={','.join(map(str, worker.gpus))} "
            f"device={worker.device} argv={list(worker.argv)} ---"
        )
        env = {**self._base_env, **worker.env}
        result = procs.spawn(worker.argv, env, worker.cwd, log_path, header)
        runtime = WorkerRuntime(
            spec=worker, pid=result.pid, start_ticks=result.start_ticks, popen=result.popen
        )
        if result.pid == 0:
            runtime.exit_code = result.exit_code
            runtime.group_gone = True
            runtime.error = result.error
        event = "worker-started" if result.pid else "worker-start-failed"
        self._log(
            event,
            dict(
                job=worker.job,
                index=worker.index,
                pid=result.pid,
                cause=cause,
                gpus=list(worker.gpus),
                error=result.error or None,
            ),
        )
        return runtime

    def _stop(self, name: str, reason: str, grace: float) -> None:
        job = self._jobs.get(name)
        if job is None or job.alive() == 0:
            return
        deadline = self._clock() + max(grace, 0.0)
        if job.stopping:
            if job.stop_deadline is None or deadline < job.stop_deadline:
                job.stop_deadline = deadline  # a shorter grace asked later wins
            return
        for worker in job.workers:
            if worker.exit_code is None:
                worker.stop_sent = True  # its exit is ours, not a crash
            if not worker.group_gone:
                procs.signal_group(worker.pgid, signal.SIGTERM)
        job.stopping, job.stop_deadline, job.stop_reason = True, deadline, reason
        job.killed = False
        self._dirty = True
        self._log("stopping", {"job": name, "reason": reason, "grace_seconds": grace})

    def _signal(self, action: SignalJob) -> None:
        """Deliver the on_change signal to each worker's main process, which passes it on."""
        job = self._jobs.get(action.job)
        if job is None:
            return
        sent = [
            worker.pid
            for worker in job.workers
            if worker.exit_code is None
            and procs.same_process_alive(worker.pid, worker.start_ticks)
            and procs.signal_process(worker.pid, action.signum)
        ]
        self._log("signalled", {"job": action.job, "signal": action.signum, "pids": sent})
        self._accept(action.job, action.fingerprint)

    def _accept(self, name: str, fingerprint: str) -> None:
        job = self._jobs.get(name)
        if job is None or job.fingerprint == fingerprint:
            return
        # A new spec ends a crash loop's verdict: it may well fix the crash.
        job.fingerprint = fingerprint
        job.gave_up, job.crash_restarts, job.next_restart_at = False, 0, None
        self._dirty = True

    def _schedule(self, action: ScheduleRestart) -> None:
        job = self._jobs.get(action.job)
        if job is not None:
            job.next_restart_at = action.at
            self._dirty = True

    def _give_up(self, action: GiveUp) -> None:
        job = self._jobs.get(action.job)
        if job is not None and not job.gave_up:
            job.gave_up, job.next_restart_at, job.message = True, None, action.reason
            self._dirty = True
            self._log("gave-up", {"job": action.job, "reason": action.reason})

    def _forget(self, name: str) -> None:
        job = self._jobs.get(name)
        if job is None:
            return
        if job.alive() > 0:  # never lose track of live processes
            self._log("forget-refused", {"job": name, "reason": "workers still alive"})
            return
        del self._jobs[name]
        self._dirty = True

    # --- reaping ----------------------------------------------------------------------

    def tick(self) -> list[WorkerExit]:
        """Reap exits, escalate overdue stops to SIGKILL, mark gone groups; return the exits."""
        exits, self._pending_exits = self._pending_exits, []
        now = self._clock()
        for job in self._jobs.values():
            exits.extend(self._collect(job))
            if job.stopping and job.stop_deadline is not None and now >= job.stop_deadline:
                self._kill(job)
        self._settle()
        return exits

    def _collect(self, job: JobRuntime) -> list[WorkerExit]:
        exits: list[WorkerExit] = []
        for worker in job.workers:
            if worker.group_gone:
                continue
            for pid, code in procs.reap_group(worker.pgid):
                if pid == worker.pid and worker.exit_code is None:
                    exits.append(self._exited(job, worker, code))
            if worker.exit_code is None:
                polled = poll_leader(worker)
                if polled is not None:
                    exits.append(self._exited(job, worker, polled))
            if worker.exit_code is not None and not procs.group_alive(worker.pgid):
                worker.group_gone = True
                self._dirty = True
        return exits

    def _exited(self, job: JobRuntime, worker: WorkerRuntime, code: int) -> WorkerExit:
        worker.exit_code = code
        if worker.popen is not None and worker.popen.returncode is None:
            worker.popen.returncode = code  # it is reaped: Popen must never wait on the pid again
        crash = code != 0 and not worker.stop_sent and not job.stopping
        index = worker.spec.index
        message = worker.error or f"worker {index} exited with {procs.describe_exit(code)}"
        if crash:
            ran = self._clock() - job.started_at
            job.note_crash(code, message, ran)
        self._dirty = True
        fields = dict(job=job.spec.job, index=index, pid=worker.pid, exit_code=code, crash=crash)
        self._log("worker-exited", fields)
        return WorkerExit(job.spec.job, index, worker.pid, code, crash, message)

    def _kill(self, job: JobRuntime) -> None:
        for worker in job.workers:
            if not worker.group_gone:
                procs.signal_group(worker.pgid, signal.SIGKILL)
        if not job.killed:
            job.killed = True
            self._log("killed", {"job": job.spec.job, "reason": "grace period over"})

    def _settle(self) -> None:
        """Finish stops whose groups are all gone, refresh states, save if anything changed."""
        stamp = format_time(self._wall())
        for job in self._jobs.values():
            if job.stopping and job.alive() == 0:
                job.stopping, job.stop_deadline = False, None
                self._dirty = True
                self._log("stopped", {"job": job.spec.job, "reason": job.stop_reason})
            if job.refresh_state(stamp):
                self._dirty = True
        if self._dirty:
            self._save()

    # --- shutdown ----------------------------------------------------------------------

    def stop_all(self, grace: float | None = None, wait: bool = True) -> None:
        """Gracefully stop every job (``grace`` or each job's own) and wait until all are gone.

        Waits in real time, polling :meth:`tick`; escalation to SIGKILL follows
        the injected clock. Gives up waiting (and logs) if some group outlives
        its SIGKILL by :data:`_KILL_WAIT_SECONDS`, e.g. a process stuck in the kernel.
        """
        longest = 0.0
        for name, job in sorted(self._jobs.items()):
            job_grace = job.spec.grace_seconds if grace is None else grace
            longest = max(longest, job_grace)
            self._stop(name, "agent stopping", job_grace)
        self._settle()
        if not wait:
            return
        give_up_at = time.monotonic() + longest + _KILL_WAIT_SECONDS
        while True:
            self.tick()
            alive = sorted(name for name, job in self._jobs.items() if job.alive() > 0)
            if not alive:
                return
            if time.monotonic() > give_up_at:
                self._log("stop-incomplete", {"jobs": alive})
                return
            time.sleep(_STOP_POLL_SECONDS)

    # --- state file and adoption ---------------------------------------------------------

    def _save(self) -> None:
        try:
            write_state_file(self.state_file, self._jobs)
            self._dirty = False
        except OSError as exc:
            self._log("state-write-failed", {"path": str(self.state_file), "error": str(exc)})

    def _load(self) -> dict[str, Any]:
        try:
            return read_state_file(self.state_file)
        except StateFileError as exc:
            self._log("state-unreadable", {"path": str(self.state_file), "error": str(exc)})
            return {}

    def adopt(self) -> AdoptReport:
        """After an agent restart: take over recorded workers that still run, forget the rest.

        A recorded worker is adopted only if its pid is alive and its process
        start time equals the recorded one (a reused pid is someone else's).
        When the main process is gone but its group still has members, the
        job is tracked too, so the planner stops those orphans before a
        replacement starts. Call once, before the first ``plan()``.
        """
        adopted: list[str] = []
        stale: list[str] = []
        outcomes: list[AdoptedWorker] = []
        for name, entry in sorted(self._load().items()):
            if name in self._jobs:
                continue
            try:
                job = job_from_state(entry)
            except (KeyError, TypeError, ValueError) as exc:
                self._log("adopt-skipped", {"job": name, "error": f"bad state entry: {exc}"})
                stale.append(name)
                continue
            outcomes.extend(
                AdoptedWorker(name, w.spec.index, w.pid, classify_recorded(w)) for w in job.workers
            )
            if job.alive() > 0:
                self._jobs[name] = job
                adopted.append(name)
            else:
                stale.append(name)
        self._dirty = True
        self._settle()
        for outcome in outcomes:  # the loop logs the job lists; this says why, per worker
            self._log(
                "adopt-worker",
                dict(
                    job=outcome.job, index=outcome.index, pid=outcome.pid, outcome=outcome.outcome
                ),
            )
        return AdoptReport(tuple(adopted), tuple(stale), tuple(outcomes))
