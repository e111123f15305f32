"""The host agent: supervise, reconcile, and hear from the store through its link.

Level-based: every read of the store (after each change, and a periodic full
re-read) recomputes the desired workers from the policy and the assignments
and compares them with what runs; the supervisor carries out the planned
actions. The loop sleeps on the link's queue between ticks, so it costs
nearly nothing while nothing happens.

Hard rules kept here:

* The loop never calls the store: the store link (its own thread) does
  every store call, so a store endpoint that hangs cannot delay reaping,
  SIGKILL escalation, crash restarts, signals or the systemd watchdog.
* A store outage never stops a worker: the last known assignment stays in
  force until the link brings a newer read.
* An unexpected error in one step (a bug) never stops a worker either: it is
  logged with its traceback, the last good state is kept, and the step is
  retried with backoff. Only an orderly stop (SIGTERM) stops workers; if the
  agent itself dies of a bug, workers keep running and the next agent adopts
  them.
* Adoption happens before the first plan, so a restarted agent never runs a
  second copy of a worker; systemd hears ``READY=1`` only after adoption.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from allocator import __version__
from allocator.agent.batch.runner import BatchRunner
from allocator.agent.config import AgentConfig
from allocator.agent.gpu_care.care import GpuCare
from allocator.agent.gpu_care.observe import Observer
from allocator.agent.lifecycle import WITHDRAW_SECONDS, Lifecycle
from allocator.agent.log import DecisionLog, as_fields
from allocator.agent.notify import notifier_from_environ
from allocator.agent.planning.action_log import action_fields, action_name
from allocator.agent.planning.desired_cache import DesiredCache
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.exclusive_claims import gpu_holders
from allocator.agent.planning.job_phase import Stopping
from allocator.agent.planning.limit_ends import limit_releases, next_limit_in
from allocator.agent.planning.port_table import PortTable
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import Finish, IdleRelease
from allocator.agent.planning.whole_job_end import (
    agents_gone_since,
    shares_unreported_since,
    whole_job_end,
)
from allocator.agent.processes.holding_ends import HoldingEnds
from allocator.agent.processes.supervisor import Supervisor
from allocator.agent.step_guard import StepGuard
from allocator.agent.sync.history_decisions import DecisionRecorder
from allocator.agent.sync.reports import agent_record, worker_records
from allocator.agent.sync.run_expiry import expiry_entry
from allocator.agent.sync.store_sync import StoreSync
from allocator.agent.sync.utilisation_report import UtilisationReport
from allocator.placement.reservations import active_reservations
from allocator.policy import Policy
from allocator.records.types import Assignment, HistoryEntry
from allocator.store import Store, open_store, resolve_store_url
from allocator.util.times import format_time, utc_now

__all__ = ["BUSY_TICK_SECONDS", "FIRST_BUSY_TICK_SECONDS", "WITHDRAW_SECONDS", "Agent", "busy_tick"]

#: The longest the loop sleeps before reaping exits and checking timers.
TICK_SECONDS = 0.2
#: How often it looks while workers are being stopped or started: a replacement
#: starts as soon as the old process group is gone. Most stops take a few
#: milliseconds, so it looks every millisecond at first, then less often (up
#: to this) the longer a stop takes: a grace period costs no CPU to wait out.
BUSY_TICK_SECONDS = 0.005
FIRST_BUSY_TICK_SECONDS = 0.001


def busy_tick(busy_for: float) -> float:
    """The loop's tick ``busy_for`` seconds into a stop or start: 1 ms, growing to 5 ms."""
    return min(BUSY_TICK_SECONDS, max(FIRST_BUSY_TICK_SECONDS, busy_for / 10))


class Agent:
    """One host's agent. ``run()`` returns when SIGTERM/SIGINT arrives.

    Its parts own their state: ``sync`` (the store link and what the store
    said), ``care`` (the GPUs and their MPS daemons), ``supervisor`` (the
    processes), ``wanted`` (the desired jobs), ``observer`` (usage and
    metrics) and ``decisions`` (the history the agent writes). The agent
    wires them in its loop and keeps only the loop's own pace and flags.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
        environ: Mapping[str, str] | None = None,
        reload_config: Callable[[], AgentConfig] | None = None,
        store_opener: Callable[[str], Store] = open_store,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall
        # systemd's variables leave the environment here, so no worker inherits them.
        source = os.environ if environ is None else dict(environ)
        self.notifier = notifier_from_environ(source)
        environ = dict(source)
        self.url = resolve_store_url(config.store)
        self.log = DecisionLog(config.log_format, config.host)
        config.agent_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(
            config.worker_log_dir, config.agent_dir / "workers.json", clock=clock, logger=self.log
        )
        self.holding_ends = HoldingEnds(self.log, config.prefix)
        self.sync = StoreSync(config, self.url, self.log, open_store=store_opener, clock=clock)
        link = self.sync.link
        self.batch = BatchRunner(
            self.url,
            config.prefix,
            config.host,
            config.worker_log_dir,
            self.log,
            store_opener,
            sweep_seconds=lambda: link.pacing.resync_seconds,
        )
        self.care = GpuCare(environ, config.agent_dir, self.log, clock())
        self.wanted = DesiredCache(
            PortTable(config.agent_dir / "ports.json", self.log),
            frozenset(os.sched_getaffinity(0)),
        )
        self.decisions = DecisionRecorder(config.host, pinned=self.care.pins)
        self.observer = Observer(environ, config.host, self.log, clock, self.care.inventory.vendor)
        self.utilisation = UtilisationReport(config.utilisation_report_seconds)
        self.started_at = format_time(wall())
        self.guard = StepGuard(
            clock, self.log, lambda: {"keeping_workers": len(self.supervisor.views())}
        )
        self.reconciled = False  # the agent knows what it runs (and publishes its workers)
        self.lifecycle = Lifecycle(
            reload_config=reload_config,
            log=self.log,
            sync=self.sync,
            supervisor=self.supervisor,
            care=self.care,
            notifier=self.notifier,
            observer=self.observer,
            guard=self.guard,
            clock=clock,
            read_inventory=self._read_inventory,
            offer=self._offer,
        )
        self.busy = False  # stopping or starting: the loop looks more often
        self.busy_since = 0.0
        self.peers_gone: dict[str, float] = {}  # peer host -> when its agent was seen gone
        # (peer host, job) -> since when its live agent has no report on the job's assignment
        self.peers_unreported: dict[tuple[str, str], float] = {}
        self.held_back: dict[str, str] = {}  # finished share -> why its job is not released
        self.finished_here: set[str] = set()  # jobs this agent saw finish (not adopted so)
        self.results_recorded: set[tuple[str, int]] = set()  # (job, revision) "failed" entries

    # --- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Adopt, then supervise and reconcile until asked to stop; return an exit code."""
        if self.config.metrics_port is not None:  # a port in use is refused before anything
            self.observer.serve_metrics(self.config.metrics_address, self.config.metrics_port)
        self.lifecycle.install_signal_handlers()
        report = self.supervisor.adopt()
        self.log("adopt", {"adopted": sorted(report.adopted), "stale": sorted(report.stale)})
        self.log(
            "start",
            {"store": self.url, "version": __version__, "inventory": self.care.inventory.source},
        )
        self.sync.link.start()
        self.batch.start()
        self.notifier.ready(f"supervising {len(report.adopted)} adopted job(s); connecting")
        orderly = False
        try:
            while not self.lifecycle.stop_requested:
                self._step()
            orderly = True
        finally:
            self.batch.stop()
            self.lifecycle.shutdown(self.config, orderly=orderly, reconciled=self.reconciled)
        return 0

    def _step(self) -> None:
        if self.lifecycle.reload_requested:
            self.guard.run("reload", self._reload)
        self._drain(self._sleep_for(self.clock()))
        if self.sync.pending is not None:
            self.guard.run("read", self._take_view)
        if self.care.due(self.clock()):
            self.guard.run("health", lambda: self._check_health(self.clock()))
            self.guard.run("usage", lambda: self._observe(self.clock()))
        self.guard.run("reap", self._reap)
        if self.sync.have_state:
            assignments, host = self.sync.assignments, self.config.host
            self.guard.run(
                "sweep", lambda: self.holding_ends.sweep(self.clock(), host, assignments)
            )
        self.guard.run("holdings", lambda: self.holding_ends.tick(self.clock()))
        if self.sync.have_state:
            started = self.clock()
            self.guard.run("reconcile", lambda: self._reconcile(self.clock()))
            self.observer.reconcile.observe(self.clock() - started)
        if self.sync.last_good_due:
            self.guard.run("save", self.sync.save_last_good)
        self.guard.run("publish", self._offer)
        self.notifier.ping(self.clock())

    def _sleep_for(self, now: float) -> float:
        due = [self.care.next_check]
        later = (self.guard.next_retry(), self.notifier.next_ping, self.supervisor.next_due())
        due += [t for t in later if t is not None]
        limit = next_limit_in(self.sync.assignments, self.wall())
        if limit is not None:  # a time limit ends then: wake for it, not a tick later
            due.append(now + limit)
        tick = busy_tick(now - self.busy_since) if self.busy else TICK_SECONDS
        return max(0.0, min(tick, *(t - now for t in due)))

    def _drain(self, timeout: float) -> None:
        state = self.sync.drain(timeout)
        if state is not None:
            self.observer.store_state(state.connected, self.clock())
            self.notifier.status(self._status_line(state.detail))

    def _status_line(self, detail: str) -> str:
        store = "store connected" if self.sync.connected else f"store unavailable ({detail})"
        return f"{len(self.supervisor.views())} job(s); {store}"

    # --- what the store says ---------------------------------------------------

    def _policy_changed(self, policy: Policy) -> None:
        self.care.use_policy(policy, self.config.host, self.clock())

    def _reload(self) -> None:
        self.config = self.lifecycle.reload(self.config)

    def _read_inventory(self) -> None:
        """NVML's GPUs (the last good ones while it fails), else the count the policy declares."""
        self.care.read_inventory(self.sync.policy, self.config.host, self.clock())

    # --- health, reconcile, publish --------------------------------------------

    def _check_health(self, now: float) -> None:
        sync = self.sync
        self.care.check(now, sync.policy, self.config.host, sync.known_assignments())

    def _observe(self, now: float) -> None:
        """Sample GPU usage (unassigned processes, idle holders); hand idle releases to the link."""
        views, roots = self.supervisor.views(), self.supervisor.process_roots()
        sync, desired = self.sync, self.wanted.desired
        state = (sync.assignments, sync.revisions, self.care.unhealthy)
        self.observer.sample(now, self.wall(), sync.policy, desired, views, roots, *state)
        self._hand_releases()

    def _hand_releases(self) -> None:
        """Offer the link every release due: idle holders, ``release_on_exit``, time limits.

        One list (the link forgets a release no longer offered); a job across
        hosts is released whole, as all its shares judge it
        (:mod:`allocator.agent.planning.whole_job_end`; a dead peer's after
        the agent's own lease TTL), and a later assignment is never touched.
        """
        ends = limit_releases(self.sync.assignments, self.sync.revisions, self.wall())
        self.sync.link.release_idle([*self.observer.releases, *self._exit_releases(), *ends])

    def _exit_releases(self) -> list[IdleRelease]:
        """Finished ``release_on_exit`` jobs to release; why the others across hosts wait."""
        held, peers, now = self.sync.assignments, self.sync.peers, self.clock()
        self.peers_gone = agents_gone_since(self.peers_gone, peers, now)
        gone_for = {host: now - since for host, since in self.peers_gone.items()}
        self.peers_unreported = shares_unreported_since(self.peers_unreported, held, peers, now)
        finished, self.held_back, views = [], {}, self.supervisor.views()
        # Before the first read the other shares are unknown, not ended: no exit release.
        ends = self.supervisor.exit_releases() if self.sync.have_state else {}
        for job, (revision, reason) in ends.items():
            if job in held and len(held[job].nodes) > 1:
                want, view = self.wanted.desired.get(job), views.get(job)
                if want is None:  # its rules are not known yet: judged at the next step
                    continue
                restarts = view.crash_restarts if view is not None else 0
                rule, ttl = want.release_on_exit, self.config.lease_ttl
                quiet = {h: now - t for (h, j), t in self.peers_unreported.items() if j == job}
                end = whole_job_end(held[job], reason, rule, peers, gone_for, ttl, restarts, quiet)
                if not end.release:  # the status says why, instead of a release not made
                    self.held_back[job] = end.reason
                    if end.failed:
                        self._record_failed(held[job], revision, end.reason)
                    continue
                reason = end.reason
            finished.append(IdleRelease(job, revision, reason, kind="exit"))
        return finished

    def _record_failed(self, held: Assignment, revision: int, reason: str) -> None:
        """Record once that another share's crash ended a job whose share finished here.

        Only by the agent that saw its share finish: one restarted since
        finds the job ended already, and its entry (if any) made.
        """
        key, policy = (held.job, revision), self.sync.policy
        if held.job not in self.finished_here or key in self.results_recorded or policy is None:
            return
        self.results_recorded.add(key)
        entry = self.decisions.job_failed(held, reason, format_time(self.wall()))
        self.sync.link.record_history([entry], policy.history)

    def _reap(self) -> None:
        for exited in self.supervisor.tick():
            self.log("exit", as_fields(exited))

    def _reconcile(self, now: float) -> None:
        before = self.wanted.update(self._desired_inputs())
        if before is not None:  # recomputed: something it reads changed
            desired = self.wanted.desired
            self._history(self.decisions.desired_changed, before, desired, self.care.pins)
        for want in self.wanted.note_failed(self.sync.revisions):
            self.log("job-failed", {"job": want.job, "reason": want.message})
        desired, views = self.wanted.desired, self.supervisor.views()
        planned = plan(desired, views, now)
        mps = self.care.mps
        mps.carry_out(mps.wanted(desired, views, self.care.gpus), now)
        actions = mps.hold_starts(planned, desired)  # starts wait for their MPS daemons
        for action in actions:
            self.log(action_name(action), action_fields(action))
            self.supervisor.apply(action)
            if isinstance(action, Finish):
                self.finished_here.add(action.job)
        self._history(self.decisions.actions, actions, desired)
        self._hand_releases()  # cheap: the link hears only of releases new to it
        stopping = any(isinstance(view.phase, Stopping) for view in views.values())
        busy = bool(actions) or mps.waiting or stopping
        if busy and not self.busy:
            self.busy_since = now
        self.busy = busy
        self.reconciled = True

    def _desired_inputs(self) -> DesiredInputs:
        """Everything the desired jobs follow from, read from the agent's parts now."""
        sync, host = self.sync, self.config.host
        assert sync.policy is not None
        wall = self.wall()  # reservations are judged by this host's clock
        views = self.supervisor.views()
        running = {job for job, view in views.items() if view.alive}
        return DesiredInputs(
            policy=sync.policy,
            policy_sha=sync.policy_sha,
            host=host,
            assignments=sync.assignments,
            assignment_revisions=sync.revisions,
            inventory=self.care.gpus,
            unhealthy=self.care.unhealthy,
            failed=self.wanted.failed,
            now=wall,
            reservations=active_reservations(sync.policy, host, wall),
            holders=gpu_holders(views),
            pinned=self.care.pins,
            ports=self.wanted.ports.allocate(sync.policy, host, sync.assignments, running),
            master_addr=self.config.local_master_addr,
            peers=sync.peers,
            address=self.config.advertised_address,
            allowed_cpus=self.wanted.allowed_cpus,
            mps_dir=str(self.care.mps.root),
            vendor=self.care.inventory.vendor,
            host_named=sync.host_named,
        )

    def _take_view(self) -> None:
        """Take the newest read; end the run-held assignments it no longer has.

        Their end goes to history, and whatever of them still runs on this
        host is stopped (:mod:`allocator.agent.processes.holding_ends`).
        """
        self.sync.take_view(self._policy_changed)
        policy, seen_gone = self.sync.policy, self.wall()
        keep = policy.history if policy is not None else None
        for held, revision in self.sync.vanished_runs:
            self.holding_ends.end(held)
            entry = expiry_entry(held, self.config.host, seen_gone)
            self.sync.link.record_history([entry], keep, unless_ended_after=revision)

    def _history(self, decide: Callable[..., list[HistoryEntry]], *args: Any) -> None:
        """Hand the link the history entries ``decide`` finds (it writes them when it can)."""
        entries = decide(*args, self.sync.assignments, format_time(self.wall()))
        policy = self.sync.policy
        if entries and policy is not None:
            self.sync.link.record_history(entries, policy.history)

    def _offer(self) -> None:
        """Hand the link what to publish; it writes only what differs from the store."""
        care = self.care
        record = agent_record(
            self.config.host,
            care.inventory,
            care.unhealthy,
            started_at=self.started_at,
            version=__version__,
            address=self.config.advertised_address,
            unassigned=self.observer.unassigned,
        )
        running, idle = self.supervisor.records(), self.observer.idle_since
        workers = None
        if self.reconciled:  # before that, the agent does not know yet what it runs
            workers = worker_records(
                self.config.host, self.wanted.desired, running, idle, self.held_back
            )
        self.utilisation.interval = self.config.utilisation_report_seconds  # reloadable
        utilisation = self.utilisation.update(self.observer.usage, self.clock())
        self.sync.link.offer(record, workers, utilisation)
        assignments = self.sync.assignments
        self.observer.note(care.inventory, care.unhealthy, assignments, running, __version__)
