"""The agent's process supervisor: carries out planned actions on real processes.

``plan()`` decides; the :class:`Supervisor` does. Each worker runs under a
small shim (:mod:`allocator.agent.shim.main`) in a session of its own, as the
user its job names, with its environment fixed before exec. A worker is its
whole process tree (:mod:`allocator.agent.processes.tree`): a stop is SIGTERM to every
process of it, a grace period, then SIGKILL to every process of it, and a
worker holds its GPUs until nothing of the tree is left. Exits are reaped,
crashes counted apart from change restarts, and a stop the agent ordered is
never a crash. A state file lets an agent restarted after ``kill -9`` adopt
the workers still running instead of starting duplicates, and the shims'
status files tell it how the others ended.

Nothing here blocks for a grace period: :meth:`Supervisor.apply` sends
signals and records deadlines, :meth:`Supervisor.tick` (called by the loop
every few hundred milliseconds) reaps, escalates overdue stops and notices
trees that are gone. Only :meth:`Supervisor.stop_all` waits, for shutdown.
Stopping and reaping are the :class:`~allocator.agent.processes.reaping.Reaper`'s,
and the tracked jobs with their state file the
:class:`~allocator.agent.processes.job_book.JobBook`'s: collaborators the
supervisor makes and holds.

The agent makes itself a child subreaper (see :func:`procs.become_subreaper`):
if a shim is killed outright, its orphans come to the agent, which reaps them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import agent_scope, worker_cgroup_base
from allocator.agent.kernel.procs import clean_base_env
from allocator.agent.planning.job_phase import JobEvent, JobPhase
from allocator.agent.planning.types import (
    Accept,
    Action,
    Confirm,
    DesiredJob,
    Finish,
    Forget,
    GiveUp,
    JobView,
    ScheduleRestart,
    SignalJob,
    Start,
    Stop,
    WorkerExit,
)
from allocator.agent.processes import tree
from allocator.agent.processes.adoption import (
    AdoptedWorker,
    AdoptReport,
    from_status_files,
    sweep,
    take_over,
)
from allocator.agent.processes.job_book import JobBook, Logger, log_to_logging
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime
from allocator.agent.processes.launch import (
    SHIM,
    launch_worker,
    log_header,
    prepare_worker,
    reserve_log,
    shim_env,
    worker_log,
)
from allocator.agent.processes.output_tail import failed_output
from allocator.agent.processes.reaping import Reaper
from allocator.agent.processes.shim_census import wait_for_starting_shims
from allocator.agent.processes.warm_shim import WarmShims
from allocator.agent.processes.worker_status import record_status, status_fields
from allocator.util.times import format_time, utc_now

__all__ = ["AdoptReport", "AdoptedWorker", "Logger", "Supervisor", "WorkerExit", "clean_base_env"]

#: A start that could not be recorded (a full disk) is tried again this much later.
RECORD_RETRY_SECONDS = 5.0


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
        cgroups: bool = True,
        warm_shim: bool = True,
        boot_id: str | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.state_file = Path(state_file)
        self.status_dir = self.state_file.parent / "workers"
        self._base_env = clean_base_env(os.environ if base_env is None else base_env)
        self._clock = clock
        self._wall = wall
        self._log: Logger = logger or log_to_logging
        # Adoption is per boot: a pid recorded before a reboot names someone else now.
        self.boot_id = procs.current_boot_id() if boot_id is None else boot_id
        self._book = JobBook(self.state_file, self.boot_id, wall=wall, log=self._log)
        self._jobs = self._book.jobs  # the same dict: the book's jobs, read here often
        # See the module docstring: orphans of a shim killed outright come to us.
        self.subreaper = procs.become_subreaper() if subreaper else False
        scope = agent_scope(self.state_file.parent)
        self.cgroup_base, why = worker_cgroup_base(scope=scope) if cgroups else (None, "disabled")
        base = str(self.cgroup_base) if self.cgroup_base else None
        self._log("process-tracking", {"cgroups": base, "why_not": why or None})
        # One shim started ahead of time: a worker start then costs no interpreter start.
        self.warm = WarmShims(
            SHIM, self.state_file.parent, shim_env, clock=clock, enabled=warm_shim
        )
        self._reaper = Reaper(self._book, self.warm, self.cgroup_base, clock=clock, log=self._log)

    # --- snapshots ----------------------------------------------------------------

    def next_due(self) -> float | None:
        """When :meth:`tick` has something to do that is not a process event (None: nothing)."""
        return self.warm.due()

    def tick(self) -> list[WorkerExit]:
        """Reap exits, escalate overdue stops to SIGKILL, mark gone trees; return the exits."""
        return self._reaper.tick()

    def stop_all(self, grace: float | None = None, wait: bool = True) -> None:
        """Gracefully stop every job and wait until all are gone (see :meth:`Reaper.stop_all`)."""
        self._reaper.stop_all(grace, wait)

    def views(self) -> dict[str, JobView]:
        """Snapshot of every tracked job for ``plan()`` (call :meth:`tick` first)."""
        return {name: job.view() for name, job in sorted(self._jobs.items())}

    def records(self) -> dict[str, dict[str, Any]]:
        """Per job what the loop publishes as a WorkerRecord (see :meth:`JobRuntime.record`)."""
        return {name: job.record() for name, job in sorted(self._jobs.items())}

    def process_roots(self) -> dict[str, tuple[tuple[int, int | None, str, str], ...]]:
        """Per job, each live worker's tree root (see :meth:`JobRuntime.tree_roots`)."""
        return {name: job.tree_roots() for name, job in sorted(self._jobs.items())}

    # --- actions --------------------------------------------------------------------

    def apply(self, action: Action) -> None:
        """Carry out one planned action; never waits for a grace period, never raises for it."""
        if isinstance(action, Start):
            self._start(action)
        elif isinstance(action, Stop):
            self._reaper.stop(action.job, action.reason, action.grace_seconds)
        elif isinstance(action, SignalJob):
            self._signal(action)
        elif isinstance(action, Accept):
            self._accept(action.job, action.fingerprint)
        elif isinstance(action, Confirm):
            self._confirm(action)
        elif isinstance(action, ScheduleRestart):
            self._schedule(action)
        elif isinstance(action, GiveUp):
            self._give_up(action)
        elif isinstance(action, Finish):
            self._finish(action)
        elif isinstance(action, Forget):
            self._forget(action.job)
        self._book.settle()

    def _start(self, action: Start) -> None:
        old = self._jobs.get(action.job)
        if old is not None and old.alive() > 0:
            # Never two copies: the planner waits for the old trees, this is the backstop.
            self._log("start-refused", {"job": action.job, "reason": "old workers still alive"})
            return
        spec = action.spec
        if spec.state != "run" or not spec.workers:
            self._log(
                "start-refused", {"job": action.job, "reason": f"nothing to run ({spec.state})"}
            )
            return
        if old is not None and not self._book.move(old, JobEvent.START):
            return
        job = JobRuntime(spec=spec, fingerprint=spec.fingerprint, started_at=self._clock())
        if old is not None:
            job.inherit_counters(old)
            for worker in old.workers:
                tree.discard(worker)
        job.count_start(action.cause)
        job.workers = [
            prepare_worker(worker, self.status_dir, self.cgroup_base) for worker in spec.workers
        ]
        self._jobs[action.job] = job
        # Before any fork: a restarted agent finds every shim this start makes, and
        # a worker it could not find (nothing recorded) is a worker never started.
        why = self._record_launch(job, action.cause)
        if why:
            self._hold(job, why)
            return
        for worker in job.workers:
            self._launch(spec, worker, action.cause)
            if worker.exit_code is not None:  # could not even start: an immediate crash
                crash = self._reaper.exited(job, worker, worker.exit_code)
                self._reaper.pending_exits.append(crash)
        self._book.dirty = True

    def _record_launch(self, job: JobRuntime, cause: str) -> str:
        """Save the state, then each worker's first status file and log line; "" or why not.

        A full log disk is no crash of the job's: like a full state disk, the
        start waits and says why, and is never given up on.
        """
        why = self._book.save()
        stamp = format_time(self._wall())
        for worker in job.workers:
            if why:
                break
            fields = status_fields(job.spec, worker, self.boot_id)
            why = record_status(Path(worker.status_path), fields)
            header = log_header(worker.spec, cause, stamp)
            why = why or reserve_log(worker_log(self.log_dir, job.spec, worker), header)
        return why

    def _hold(self, job: JobRuntime, why: str) -> None:
        """Launch nothing of ``job``: it waits (and says why) until a retry can record it."""
        for worker in job.workers:
            tree.discard(worker)  # a prepared status file or cgroup, where there was room
        if self._book.move(job, JobEvent.HOLD):
            job.hold(why, self._clock() + RECORD_RETRY_SECONDS)
        self._log("start-held", {"job": job.spec.job, "reason": why})
        self._book.dirty = True

    def _launch(self, spec: DesiredJob, worker: WorkerRuntime, cause: str) -> None:
        event, fields = launch_worker(
            spec,
            worker,
            cause,
            base_env=self._base_env,
            log_dir=self.log_dir,
            stamp=format_time(self._wall()),
            warm=self.warm.take(),
            boot_id=self.boot_id,
            header_written=True,  # by _record_launch
        )
        self._log(event, fields)

    def _signal(self, action: SignalJob) -> None:
        """Deliver the on_change signal to each worker's main process (through its shim)."""
        job = self._jobs.get(action.job)
        if job is None:
            return
        sent = [
            worker.shown_pid
            for worker in job.workers
            if worker.exit_code is None and tree.signal_main(worker, action.signum)
        ]
        self._log("signalled", {"job": action.job, "signal": action.signum, "pids": sent})
        self._accept(action.job, action.fingerprint)

    def _accept(self, name: str, fingerprint: str) -> None:
        job = self._jobs.get(name)
        if job is None or job.fingerprint == fingerprint:
            return
        if not self._book.move(job, JobEvent.ACCEPT):
            return
        job.accept(fingerprint)
        self._book.dirty = True

    def _confirm(self, action: Confirm) -> None:
        job = self._jobs.get(action.job)
        if job is not None and job.alive() > 0 and not job.phase.stopping:
            job.confirm(action.revision)
            self._book.dirty = True  # saved: a restarted agent must know it too

    def _schedule(self, action: ScheduleRestart) -> None:
        job = self._jobs.get(action.job)
        if job is not None and self._book.move(job, JobEvent.SCHEDULE_RESTART):
            job.next_restart_at = action.at
            self._book.dirty = True

    def _give_up(self, action: GiveUp) -> None:
        job = self._jobs.get(action.job)
        if job is None or job.phase is JobPhase.GAVE_UP:
            return
        if self._book.move(job, JobEvent.GIVE_UP):
            job.give_up(action.reason)
            job.output_tail, job.log_path = failed_output(job, self.log_dir)
            self._book.dirty = True
            self._log("gave-up", {"job": action.job, "reason": action.reason})

    def _finish(self, action: Finish) -> None:
        job = self._jobs.get(action.job)
        if job is not None and self._book.move(job, JobEvent.FINISH):
            job.finish(action.status, action.reason, action.release)
            self._book.dirty = True
            self._log("finished", {"job": action.job, "reason": action.reason})

    def exit_releases(self) -> dict[str, tuple[int, str]]:
        """Finished jobs whose GPUs their ``release_on_exit`` frees: job -> (assignment
        revision, why); the store link releases each only while that revision holds."""
        return {
            name: (job.spec.assignment_revision, job.message)
            for name, job in sorted(self._jobs.items())
            if job.phase is JobPhase.FINISHED and job.release_on_exit
        }

    def _forget(self, name: str) -> None:
        job = self._jobs.get(name)
        if job is None:
            return
        if job.alive() > 0:  # never lose track of live processes
            self._log("forget-refused", {"job": name, "reason": "workers still alive"})
            return
        for worker in job.workers:
            tree.discard(worker)
        del self._jobs[name]
        self._book.dirty = True

    # --- state file and adoption ---------------------------------------------------------

    def adopt(self) -> AdoptReport:
        """After an agent restart: take over every recorded job; start nothing twice.

        See :func:`adoption.take_over`. A job the agent died launching is
        stopped, so that it starts again whole. Call once, before the first ``plan()``.
        """
        ours = [self.warm.idle.pid] if self.warm.idle is not None else []
        ours += [w.pid for job in self._jobs.values() for w in job.workers]
        silent = wait_for_starting_shims(self.state_file.parent, self.status_dir, ours=ours)
        if silent:  # they run a worker no file names: the sweep cannot know them either
            self._log("shims-silent", {"pids": silent})
        jobs, report = take_over(self._book.load(), set(self._jobs), self._log)
        self._jobs.update(jobs)
        found = from_status_files(self.status_dir, self.boot_id, self._jobs, self._clock())
        self._jobs.update(found)
        report = replace(report, adopted=tuple(sorted((*report.adopted, *found))))
        for name in found:
            self._log("adopt-from-status", {"job": name, "workers": len(found[name].workers)})
        sweep(self.status_dir, self.cgroup_base, self._jobs, self._log, self.boot_id)
        for name in report.half_started:
            if jobs[name].alive() > 0:
                self._reaper.stop(name, "the agent restarted while starting the job", 0.0)
            elif jobs[name].phase is JobPhase.RUNNING:  # as if stopped: it starts again whole
                jobs[name].move(JobEvent.STOP)
                jobs[name].move(JobEvent.STOP_DONE)
        self._book.dirty = True
        self._book.settle()
        for outcome in report.workers:  # the loop logs the job lists; this says why, per worker
            self._log("adopt-worker", asdict(outcome))
        return report
