"""Stopping and reaping: the supervisor's collaborator for the end of a worker's tree.

A stop is SIGTERM to every process of a worker's tree and a deadline;
:meth:`Reaper.tick` (called by the loop every few hundred milliseconds)
reaps exits, escalates a stop past its deadline to SIGKILL, again on every
pass for forks that raced it, and marks the trees that are gone. Only
:meth:`Reaper.stop_all` waits, for shutdown. The :class:`Reaper` and the
supervisor share one :class:`~allocator.agent.processes.job_book.JobBook`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from allocator.agent.kernel.cgroups import remove_cgroup
from allocator.agent.planning.exit_codes import describe_exit
from allocator.agent.planning.job_phase import JobEvent, JobPhase
from allocator.agent.planning.types import WorkerExit
from allocator.agent.processes import tree
from allocator.agent.processes.job_book import JobBook, Logger
from allocator.agent.processes.job_state import JobRuntime, WorkerRuntime
from allocator.agent.processes.launch import SHIM_REFUSALS
from allocator.agent.processes.warm_shim import WarmShims

__all__ = ["Reaper"]

_STOP_POLL_SECONDS = 0.02
_KILL_WAIT_SECONDS = 10.0  # after SIGKILL, how long stop_all waits for the kernel to finish
_KILL_PASS_SECONDS = 0.1  # while killing, how often the tree is walked again (forks race us)
_SHIM_STUCK_SECONDS = 5.0  # a shim still there this long after its tree was killed goes too


class Reaper:
    """Stops, SIGKILL and reaped exits of the jobs in ``book`` (see the module doc)."""

    def __init__(
        self,
        book: JobBook,
        warm: WarmShims,
        cgroup_base: Path | None,
        *,
        clock: Callable[[], float],
        log: Logger,
    ) -> None:
        self._book = book
        self._warm = warm
        self._cgroup_base = cgroup_base
        self._clock = clock
        self._log = log
        #: Exits found outside :meth:`tick` (a worker that could not even start),
        #: handed out by the next tick.
        self.pending_exits: list[WorkerExit] = []

    def stop(self, name: str, reason: str, grace: float) -> None:
        job = self._book.jobs.get(name)
        if job is None or job.alive() == 0:
            return
        deadline = self._clock() + max(grace, 0.0)
        if job.phase.stopping:
            if job.stop_deadline is None or deadline < job.stop_deadline:
                job.stop_deadline = deadline  # a shorter grace asked later wins
            return
        if not self._book.move(job, JobEvent.STOP):
            return
        job.begin_stop(deadline, reason)
        self._book.save()  # recorded before the signal: a restarted agent never counts it a crash
        for worker in job.workers:
            if not worker.group_gone:
                tree.stop_tree(worker, signal.SIGTERM)
        self._log("stopping", {"job": name, "reason": reason, "grace_seconds": grace})

    def tick(self) -> list[WorkerExit]:
        """Reap exits, escalate overdue stops to SIGKILL, mark gone trees; return the exits."""
        exits, self.pending_exits = self.pending_exits, []
        now = self._clock()
        self._warm.tick()
        for job in self._book.jobs.values():
            exits.extend(self._collect(job))
            if job.phase.stopping and job.stop_deadline is not None and now >= job.stop_deadline:
                self._kill(job, now)
        self._book.settle()
        return exits

    def _collect(self, job: JobRuntime) -> list[WorkerExit]:
        exits: list[WorkerExit] = []
        for worker in job.workers:
            if worker.group_gone:
                continue
            known = worker.main_pid
            code = tree.observe(worker)
            if worker.main_pid != known:
                self._book.dirty = True  # a restarted agent should name the worker's pid too
            if code is not None:
                exits.append(self.exited(job, worker, code))
            if worker.exit_code is not None and tree.finished(worker):
                worker.group_gone = True
                tree.settle(worker)
                self._book.dirty = True
        return exits

    def exited(self, job: JobRuntime, worker: WorkerRuntime, code: int) -> WorkerExit:
        worker.exit_code = code
        crash = code != 0 and not worker.stop_sent and not job.phase.stopping
        index = worker.spec.index
        if code in SHIM_REFUSALS and not worker.main_pid and not worker.error:
            worker.error = f"worker {index} did not start: {SHIM_REFUSALS[code]}"
        message = worker.error or f"worker {index} exited with {describe_exit(code)}"
        if crash:
            first = job.phase is JobPhase.RUNNING
            if self._book.move(job, JobEvent.CRASH) and first:
                job.note_crash(code, message, self._clock() - job.started_at)
        elif not job.crash_noted:
            job.last_exit = code  # a crash's code stays the one shown
        self._book.dirty = True
        pid = worker.shown_pid
        fields = dict(job=job.spec.job, index=index, pid=pid, exit_code=code, crash=crash)
        self._log("worker-exited", fields)
        return WorkerExit(job.spec.job, index, pid, code, crash, message)

    def _kill(self, job: JobRuntime, now: float) -> None:
        """SIGKILL every process of the job's trees; again every pass, for forks that raced us."""
        if job.last_kill_pass is not None and now - job.last_kill_pass < _KILL_PASS_SECONDS:
            return
        job.last_kill_pass = now
        first = job.killed_at is None
        if job.killed_at is None:
            job.killed_at = now
        stuck = now - job.killed_at >= _SHIM_STUCK_SECONDS
        for worker in job.workers:
            if not worker.group_gone:
                tree.kill_tree(worker, shim_too=stuck)
        if first:
            self._book.dirty = True
            self._log("killed", {"job": job.spec.job, "reason": "grace period over"})

    def stop_all(self, grace: float | None = None, wait: bool = True) -> None:
        """Gracefully stop every job (``grace`` or each job's own) and wait until all are gone.

        Waits in real time, polling :meth:`tick`; escalation to SIGKILL follows
        the injected clock. Gives up waiting (and logs) if some group outlives
        its SIGKILL by :data:`_KILL_WAIT_SECONDS`, e.g. a process stuck in the kernel.
        """
        self._warm.close()
        longest = 0.0
        for name, job in sorted(self._book.jobs.items()):
            job_grace = job.spec.grace_seconds if grace is None else grace
            longest = max(longest, job_grace)
            self.stop(name, "agent stopping", job_grace)
        self._book.settle()
        if not wait:
            return
        give_up_at = time.monotonic() + longest + _KILL_WAIT_SECONDS
        while True:
            self.tick()
            alive = sorted(name for name, job in self._book.jobs.items() if job.alive() > 0)
            if not alive:
                if self._cgroup_base is not None:
                    remove_cgroup(self._cgroup_base)  # this agent's own directory, once empty
                return
            if time.monotonic() > give_up_at:
                self._log("stop-incomplete", {"jobs": alive})
                return
            time.sleep(_STOP_POLL_SECONDS)
