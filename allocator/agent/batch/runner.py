"""The host's submitted jobs: the agent is their waiter, runs them, and ends their holdings.

A thread of its own with its own store connection (the agent's loop never
calls the store). Each round it reads the host's queue and the submission
records, and for each submitted entry, in queue order:

* refuses (logs once, leaves it for the operator, never runs) an entry the
  store does not prove (:func:`~allocator.recipes.submit.proof.refusal`);
* else tries to take its turn with the same transaction as every waiter
  (:func:`~allocator.recipes.queue.wait.submitted_gate`: turn rule, quotas,
  reservations, the entry deleted in the take), as a holding bound to a
  lease this agent keeps alive (:func:`~allocator.recipes.holding.hold`);
  taken, it starts the command (:class:`~allocator.agent.batch.job.BatchProcess`).

A job that ends is released with its exit status and GPU-seconds in
history, and its record deleted. A ``--preemptible`` job whose GPUs a
normal request takes back (:mod:`allocator.recipes.queue.preempt`) gets
SIGTERM, SIGKILL after its ``grace=`` (:data:`PREEMPT_GRACE_S`), is released with history
``preempted by JOB`` and queued again (a new entry, the same record); a
normal submitted job at its turn takes such GPUs back itself. A holding released from outside
(``allocator release``, a cancel) stops the command. A record whose queue
entry is gone before it ran (a cancel, ``queue remove``) is deleted.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.agent.batch.job import BatchProcess, base_environment, output_path
from allocator.agent.batch.limit_stop import DEFAULT_GRACE, LimitStop
from allocator.agent.batch.wakeups import SWEEP_S, Wakeups
from allocator.agent.planning.limit_ends import LIMIT_REASON
from allocator.control.actor import store_user
from allocator.control.client import Allocator
from allocator.errors import (
    AllocatorError,
    BadRecord,
    CasConflict,
    ConflictError,
    InvalidInput,
    LeaseLost,
    NotFound,
    NotPermitted,
    StoreError,
)
from allocator.placement.busy_gpus import describe_blockers
from allocator.placement.request import Request
from allocator.placement.worker_env import worker_environments
from allocator.recipes.gpu_free import DEFAULT_BOUND, busy_with
from allocator.recipes.holding import DEFAULT_TTL, Holding, hold, let_go
from allocator.recipes.queue.order import Waiting, decode_queue
from allocator.recipes.queue.preempt import try_preempt
from allocator.recipes.queue.wait import submitted_gate
from allocator.recipes.submit.enqueue import requeue
from allocator.recipes.submit.proof import Runner, refusal, split_submission
from allocator.records.holding import HOLDING_VARIABLE, holding_identity
from allocator.records.keys import KeyLayout
from allocator.records.submission import Submission
from allocator.records.types import Assignment
from allocator.store import Delete, Read, Store
from allocator.store.credentials import redact_args
from allocator.store.urls import scheme_of
from allocator.util.durations import duration_text
from allocator.util.times import utc_now

__all__ = ["BatchRunner"]

#: The longest an orderly stop waits for the running commands to end and be released.
STOP_S = 10.0
#: How long a command whose holding was released has after SIGTERM before SIGKILL
#: (a policy job's default ``grace_seconds``).
GRACE_S = 10.0
#: From the SIGTERM that stops a preempted job to its SIGKILL, unless it asked (``grace=``).
PREEMPT_GRACE_S = 10.0

Log = Callable[[str, Mapping[str, Any]], None]


@dataclass
class _Running:
    allocator: Allocator
    holding: Holding
    process: BatchProcess
    limit: LimitStop
    kill_at: float | None = None  # monotonic: SIGKILL then, once SIGTERM was sent


@dataclass
class _Starting:
    allocator: Allocator
    holding: Holding
    record: Submission
    output: Path
    deadline: float  # monotonic: the end of waiting for the GPUs' previous workers


class BatchRunner:
    """Runs ``host``'s submitted jobs, from ``start()`` until ``stop()``."""

    def __init__(
        self,
        url: str,
        prefix: str,
        host: str,
        log_dir: Path,
        log: Log,
        open_store: Any,
        sweep_seconds: Callable[[], float] = lambda: SWEEP_S,
    ) -> None:
        self.url, self.prefix, self.host, self.log_dir = url, prefix, host, log_dir
        self.log, self.open_store = log, open_store
        self.layout = KeyLayout(prefix)
        self.running: dict[str, _Running] = {}
        self.starting: dict[str, _Starting] = {}  # taken, waiting for their GPUs to be free
        self.refused: set[str] = set()  # entry keys logged as refused
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Store | None = None
        self.wakeups = Wakeups(self.layout, host, time.monotonic, sweep_seconds)
        self._waiting = False  # a submitted job waits for its turn (not refused)
        self._swept = float("-inf")
        self._pointed: set[str] = set()  # the submissions the last read's entries pointed to
        self._trouble = ""  # the loop's last failure, logged once
        self._path = os.environ.get("PATH")

    def start(self) -> None:
        """Start the runner's thread."""
        self._thread = threading.Thread(target=self._loop, daemon=True, name="batch-runner")
        self._thread.start()

    def stop(self) -> None:
        """Stop the running commands (SIGTERM), release their holdings, end the thread.

        Waits for that only while commands run: with none, a store that hangs
        never delays the agent's own stop by more than a moment.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_S if self.running or self.starting else 1.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._store is None:
                    self._store = self.open_store(self.url)
                self._reap()
                self._start_free()
                if self.wakeups.due(self._waiting):
                    self.wakeups.read()
                    self._round(self._store)
                self.wakeups.wait(self._store)
                self._trouble = ""
            except AllocatorError as exc:  # an outage: the running jobs go on; try again
                self._report("batch-store-error", str(exc))
                self.wakeups.close()
                self.wakeups.changed = True
                self._stop.wait(1.0)
            except Exception as exc:  # a bug must not end the thread, nor the jobs
                self._report("batch-error", repr(exc))
                self._stop.wait(1.0)
        self._end_all()

    def _report(self, event: str, error: str) -> None:
        """Log a failure of the loop once, not once a second while it lasts."""
        if error != self._trouble:
            self._trouble = error
            self.log(event, {"error": error})

    def _round(self, store: Store) -> None:
        """Read the host's queue; refuse, take or leave each submitted entry; sweep when due."""
        (queue,) = store.read_many([Read(self.layout.host_queue(self.host), prefix=True)])
        order = [w for w in decode_queue(queue.items, self._bad) if w.entry.submission]
        keys = {w.key: self._record_key(w.entry.submission) for w in order}
        wanted = sorted({k for k in keys.values() if k is not None})
        found = {}
        if wanted:
            listings = store.read_many([Read(k) for k in wanted])
            found = {item.key: item.value for listing in listings for item in listing.items}
        self.refused &= set(keys)  # an entry removed by the operator is forgotten
        self._waiting = False
        runner = self._runner(store) if order else None
        for waiting in order:
            if runner is not None and waiting.key not in self.refused:
                self._waiting = True
                raw = found.get(keys[waiting.key] or "")
                self._consider(store, waiting, raw, runner)
        pointed = {w.entry.submission for w in order}
        ran = {f"{r.process.record.user}/{job}" for job, r in self.running.items()}
        ran |= {f"{d.record.user}/{job}" for job, d in self.starting.items()}
        # An entry gone without being taken here was cancelled: its record goes at once.
        cancelled = bool(self._pointed - pointed - ran)
        self._pointed = pointed
        if cancelled or self.wakeups.clock() - self._swept >= SWEEP_S:
            self._swept = self.wakeups.clock()
            self._sweep(store, pointed)

    def _record_key(self, pointer: str) -> str | None:
        split = split_submission(pointer)
        if split is None:
            return None
        try:
            return self.layout.submission(*split)
        except ValueError:  # a name no key may have: there is no record
            return None

    def _consider(self, store: Store, waiting: Waiting, raw: bytes | None, runner: Runner) -> None:
        entry = waiting.entry
        record = _decode(raw)
        why = refusal(entry, record, runner)
        if why is None and record is not None and not _known_user(record.user):
            why = f"this host has no user {record.user!r} to run it as"
        if why is not None or record is None:
            self._refuse(waiting, why or "no record")
            return
        self._take(store, waiting, record)

    def _refuse(self, waiting: Waiting, why: str) -> None:
        """Log it once and leave it queued for the operator: it never runs."""
        self.refused.add(waiting.key)
        entry = waiting.entry
        fields = {"entry": waiting.key, "job": entry.job, "holder": entry.holder, "reason": why}
        self.log("batch-refused", fields)

    def _runner(self, store: Store) -> Runner:
        """Who this agent is, and what its store and the policy let it run."""
        reader = Allocator(store, prefix=self.prefix)
        snapshot = reader.policy()
        allowed = snapshot.policy.submit_as_root if snapshot is not None else ()
        return Runner(
            user=_own_user(),
            is_root=os.geteuid() == 0,
            names_proven=scheme_of(self.url) == "etcd" and bool(store_user(self.url)),
            root_allowed=allowed,
        )

    def _take(self, store: Store, waiting: Waiting, record: Submission) -> None:
        allocator = Allocator(
            store, prefix=self.prefix, holder=record.user, actor=f"agent@{self.host}"
        )
        request = Request(
            job=record.job,
            host=record.host,
            gpus=record.gpus,
            count=record.count,
            slots=record.slots,
            self_service=True,
            # The limit counts from the take: the planner writes its ends_at then.
            time=duration_text(record.time_s) if record.time_s is not None else None,
            preemptible=record.preemptible,
        )
        output = output_path(record, self.log_dir)
        # Masked as `run` masks its command line: a token in an argument is never recorded.
        command = " ".join(redact_args(record.argv))[:200]
        reason = f"submitted: {command} (output {output})"
        gate = submitted_gate(allocator, request, waiting.key)
        try:
            holding = hold(
                allocator,
                request,
                ttl=DEFAULT_TTL,
                reason=reason,
                launched_by="submit",
                gate=gate,
                on_lost=lambda _why: self._lost(record.job),
            )
        except (ConflictError, LeaseLost, CasConflict):
            # Not its turn yet (or the entry went): the next change decides again. A
            # normal job at its turn takes back what preemptible jobs hold of its GPUs.
            if try_preempt(allocator, request, waiting.key):
                self.log("batch-preempting", {"job": record.job})
            return
        except (InvalidInput, NotPermitted, NotFound) as exc:  # it would never be taken
            self._refuse(waiting, str(exc))
            return
        # Its GPUs may still run the previous holder's workers: it starts once they stopped.
        deadline = time.monotonic() + DEFAULT_BOUND
        self.starting[record.job] = _Starting(allocator, holding, record, output, deadline)
        self._start_free()

    def _start_free(self) -> None:
        """Start each taken job whose GPUs no other job's processes run on any more."""
        for job, due in list(self.starting.items()):
            if due.holding.preempted_by:  # taken back before it started: queued again
                del self.starting[job]
                why = f"preempted by {due.holding.preempted_by} before it started"
                let_go(due.allocator, due.holding, 1, why)
                if not self._requeued(due.allocator, due.record):
                    self._forget(due.allocator.store, due.record)
                continue
            workers, left = busy_with(due.allocator, due.holding.assignment)
            if workers or left:
                if time.monotonic() < due.deadline:
                    continue
                why = f"gave up waiting for {describe_blockers(workers, left)} to stop"
                del self.starting[job]
                let_go(due.allocator, due.holding, 1, f"submitted job did not start: {why}")
                self._forget(due.allocator.store, due.record)
                self.log("batch-not-started", {"job": job, "error": why})
                continue
            del self.starting[job]
            self._launch(due.allocator, due.holding, due.record, due.output)

    def _launch(
        self, allocator: Allocator, holding: Holding, record: Submission, output: Path
    ) -> None:
        env = base_environment(record, self._path)
        try:
            env.update(_allocator_variables(allocator, holding.assignment))
            env[HOLDING_VARIABLE] = holding_identity(holding.assignment, self.prefix) or ""
            process = BatchProcess(record, output, env)
        except (AllocatorError, OSError) as exc:
            let_go(allocator, holding, 1, f"submitted job did not start: {exc}")
            self._forget(allocator.store, record)
            self.log("batch-not-started", {"job": record.job, "error": str(exc)})
            return
        spec = allocator.require_policy().policy.jobs.get(record.job)
        grace = spec.grace_seconds if spec is not None else DEFAULT_GRACE
        limit = LimitStop(holding.assignment.ends_at, grace)
        self.running[record.job] = _Running(allocator, holding, process, limit)
        gpus = list(holding.assignment.gpus)
        self.log("batch-started", {"job": record.job, "gpus": gpus, "output": str(output)})

    def _lost(self, job: str) -> None:
        """The holding was released or lost from outside: stop its command."""
        running = self.running.get(job)
        if running is not None:
            running.process.stop()
            running.kill_at = time.monotonic() + GRACE_S

    def _reap(self) -> None:
        wall, now = utc_now(), time.monotonic()
        for job, running in list(self.running.items()):
            signum = running.limit.due(wall, now)
            if signum is not None:
                running.process.stop(signum)
                self.log("batch-time-limit", {"job": job, "signal": signum.name})
            status = running.process.exit_status()
            by = running.holding.preempted_by
            if status is None:
                if running.kill_at is not None and time.monotonic() >= running.kill_at:
                    running.process.stop(signal.SIGKILL)  # it ignored SIGTERM past its grace
                grace = running.process.record.grace_s or PREEMPT_GRACE_S
                if by and running.process.stop_within(grace, time.monotonic()):
                    self.log("batch-preempted", {"job": job, "by": by})
                continue
            del self.running[job]
            self._end(running, status)

    def _end(self, running: _Running, status: int) -> None:
        record, output = running.process.record, running.process.output
        by = running.holding.preempted_by
        reason = f"submitted job ended (exit {status}); output {output}"
        if by:
            reason = f"preempted by {by} (exit {status}); output {output}"
        elif running.limit.reached:
            reason = f"{LIMIT_REASON} (exit {status}); output {output}"
        released = let_go(running.allocator, running.holding, status, reason)
        if by and self._requeued(running.allocator, record):
            self.log("batch-requeued", {"job": record.job, "by": by})
            return
        self._forget(running.allocator.store, record)
        fields = {"job": record.job, "exit_status": status, "released": released}
        self.log("batch-ended", fields)

    def _requeued(self, allocator: Allocator, record: Submission) -> bool:
        """Queue a preempted job again (its record kept); whether that was written."""
        try:
            requeue(allocator, record)
        except AllocatorError as exc:
            self.log("batch-not-requeued", {"job": record.job, "error": str(exc)})
            return False
        return True

    def _forget(self, store: Store, record: Submission) -> None:
        with contextlib.suppress(AllocatorError):
            store.txn([], [Delete(self.layout.submission(record.user, record.job))])

    def _sweep(self, store: Store, pointed: set[str]) -> None:
        """Delete this host's records whose entry is gone and that do not run (cancelled)."""
        for item in store.list(self.layout.submissions).items:
            record = _decode(item.value)
            busy = record is not None and (
                record.job in self.running or record.job in self.starting
            )
            if record is None or record.host != self.host or busy:
                continue
            if f"{record.user}/{record.job}" not in pointed:
                self._forget(store, record)
                self.log("batch-cancelled", {"job": record.job, "user": record.user})

    def _end_all(self) -> None:
        """An orderly stop: the running commands get SIGTERM; each is released as it ends."""
        for job, due in self.starting.items():
            let_go(due.allocator, due.holding, 1, "the agent stopped before the job started")
            self.log("batch-not-started", {"job": job, "error": "the agent stopped"})
        self.starting.clear()
        for running in self.running.values():
            running.process.stop()
        deadline = time.monotonic() + STOP_S - 1.0
        while self.running and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        self.wakeups.close()
        if self._store is not None:
            with contextlib.suppress(StoreError):
                self._store.close()

    def _bad(self, bad: BadRecord) -> None:
        self.log("bad-record", {"key": bad.key, "reason": bad.reason})


def _allocator_variables(allocator: Allocator, assignment: Assignment) -> dict[str, str]:
    """The job's variables as the agent gives a worker (its GPUs by this agent's inventory)."""
    policy = allocator.require_policy().policy
    agent = allocator.host(assignment.host).agent
    inventory = agent.gpus if agent is not None and agent.gpus else None
    vendor = (agent.vendor if agent is not None else None) or policy.vendor_of(assignment.host)
    envs = worker_environments(assignment, inventory, policy, vendor=vendor)
    return envs[0] if envs else {}


def _decode(raw: bytes | None) -> Submission | None:
    if raw is None:
        return None
    try:
        return Submission.from_json(raw)
    except BadRecord:
        return None


def _own_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _known_user(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True
