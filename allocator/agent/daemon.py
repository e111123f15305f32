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
import queue
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, assert_never

from allocator import __version__
from allocator.agent.config import AgentConfig
from allocator.agent.gpu_care.mps import MpsDaemons
from allocator.agent.gpu_care.observe import Observer
from allocator.agent.gpu_care.state import GpuState
from allocator.agent.lifecycle import WITHDRAW_SECONDS, Lifecycle
from allocator.agent.log import DecisionLog, as_fields
from allocator.agent.notify import notifier_from_environ
from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.planning.action_log import action_fields, action_name
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.exclusive_claims import gpu_holders
from allocator.agent.planning.port_table import PortTable
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import DesiredJob
from allocator.agent.processes.supervisor import Supervisor
from allocator.agent.step_guard import StepGuard
from allocator.agent.sync.history_decisions import DecisionRecorder
from allocator.agent.sync.host_records import HostView
from allocator.agent.sync.last_good import load_last_good, save_last_good
from allocator.agent.sync.messages import LinkState, ToLoop
from allocator.agent.sync.reports import agent_record, worker_records
from allocator.agent.sync.store_thread import StoreLink
from allocator.errors import PolicyError
from allocator.gpus.inventory import Inventory
from allocator.placement.reservations import active_reservations
from allocator.policy import Policy, load_policy
from allocator.records.types import HistoryEntry, PolicyRecord
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


class Agent(Lifecycle):
    """One host's agent. ``run()`` returns when SIGTERM/SIGINT arrives."""

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
        self.reload_config = reload_config
        self.clock = clock
        self.wall = wall
        # systemd's variables leave the environment here, so no worker inherits them.
        source = os.environ if environ is None else dict(environ)
        self.notifier = notifier_from_environ(source)
        self.environ = dict(source)
        self.url = resolve_store_url(config.store)
        self.log = DecisionLog(config.log_format, config.host)
        config.agent_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(
            config.worker_log_dir, config.agent_dir / "workers.json", clock=clock, logger=self.log
        )
        self.inbox: queue.Queue[ToLoop] = queue.Queue()
        self.link = StoreLink(
            config, self.url, self.log, self.inbox, open_store=store_opener, clock=clock
        )
        self.policy: Policy | None = None
        self.policy_sha = ""
        self.refused_policy_sha = ""
        # Until the store is read: what the last agent read intact (used only for
        # jobs whose record the store then holds damaged).
        self.last_good_path = config.agent_dir / "assignments.json"
        self.assignments, self.assignment_revisions = load_last_good(
            self.last_good_path, config.host
        )
        self.failed: dict[str, int] = {}
        self.peers: Mapping[str, PeerHost] = {}  # the other hosts of jobs across hosts
        self.desired: dict[str, DesiredJob] = {}
        self.gpus = GpuState(self.environ, config.agent_dir / "gpus.json", self.log, clock())
        self.ports = PortTable(config.agent_dir / "ports.json", self.log)
        self.mps = MpsDaemons(config.agent_dir / "mps", self.log, self.environ)
        self.cpus = frozenset(os.sched_getaffinity(0))  # what workers may be pinned within
        self.decisions = DecisionRecorder(config.host, pinned=self.gpus.pins)
        self.inventory: Inventory = self.gpus.inventory
        self.health = self.gpus.monitor
        self.unhealthy: dict[int, str] = dict(self.gpus.unhealthy)
        self.started_at = format_time(wall())
        self.observer = Observer(self.environ, config.host, self.log, clock)
        self.connected = False
        self.have_state = False
        self.reconciled = False
        self.said_no_policy = False
        self.next_health = 0.0
        self.stop_requested = False
        self.reload_requested = False
        self.busy = False
        self.busy_since = 0.0
        self.pending_view: HostView | None = None
        self.last_good_due = False
        self._desired_inputs: DesiredInputs | None = None
        self.guard = StepGuard(
            clock, self.log, lambda: {"keeping_workers": len(self.supervisor.views())}
        )

    # --- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Adopt, then supervise and reconcile until asked to stop; return an exit code."""
        if self.config.metrics_port is not None:  # a port in use is refused before anything
            self.observer.serve_metrics(self.config.metrics_address, self.config.metrics_port)
        self._install_signal_handlers()
        report = self.supervisor.adopt()
        self.log("adopt", {"adopted": sorted(report.adopted), "stale": sorted(report.stale)})
        self.log(
            "start", {"store": self.url, "version": __version__, "inventory": self.inventory.source}
        )
        self.link.start()
        self.notifier.ready(f"supervising {len(report.adopted)} adopted job(s); connecting")
        orderly = False
        try:
            while not self.stop_requested:
                self._step()
            orderly = True
        finally:
            self._shutdown(orderly)
        return 0

    def _step(self) -> None:
        if self.reload_requested:
            self.guard.run("reload", self._reload)
        self._drain(self._sleep_for(self.clock()))
        if self.pending_view is not None:
            self.guard.run("read", self._take_view)
        if self.clock() >= self.next_health:
            self.guard.run("health", lambda: self._check_health(self.clock()))
            self.guard.run("usage", lambda: self._observe(self.clock()))
        self.guard.run("reap", self._reap)
        if self.have_state:
            started = self.clock()
            self.guard.run("reconcile", lambda: self._reconcile(self.clock()))
            self.observer.reconcile.observe(self.clock() - started)
        if self.last_good_due:
            self.guard.run("save", self._save_last_good)
        self.guard.run("publish", self._offer)
        self.notifier.ping(self.clock())

    def _sleep_for(self, now: float) -> float:
        due = [self.next_health]
        later = (self.guard.next_retry(), self.notifier.next_ping, self.supervisor.next_due())
        due += [t for t in later if t is not None]
        tick = busy_tick(now - self.busy_since) if self.busy else TICK_SECONDS
        return max(0.0, min(tick, *(t - now for t in due)))

    def _drain(self, timeout: float) -> None:
        try:
            messages = [self.inbox.get(timeout=timeout)]
        except queue.Empty:
            return
        while True:
            try:
                messages.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        state: LinkState | None = None
        for message in messages:
            match message:
                case LinkState():
                    state = message
                case HostView():  # level-based: only the newest read matters
                    self.pending_view = message
                case _:
                    assert_never(message)
        if state is not None:
            self.connected = state.connected
            self.observer.store_state(self.connected, self.clock())
            self.notifier.status(self._status_line(state.detail))

    def _status_line(self, detail: str) -> str:
        store = "store connected" if self.connected else f"store unavailable ({detail})"
        return f"{len(self.supervisor.views())} job(s); {store}"

    # --- what the store says ---------------------------------------------------

    def _take_view(self) -> None:
        """Adopt the newest read of the store as the state to reconcile towards."""
        view = self.pending_view
        assert view is not None
        if view.policy is not None:
            self._use_policy(view.policy)
        elif self.policy is None and not self.said_no_policy:
            self.said_no_policy = True
            self.log("no-policy", {"hint": "run `allocator policy apply FILE`"})
        assignments, revisions = dict(view.assignments), dict(view.revisions)
        for job in view.damaged & self.assignments.keys():  # keep its last good assignment
            assignments[job] = self.assignments[job]
            revisions[job] = self.assignment_revisions[job]
        if (assignments, revisions) != (self.assignments, self.assignment_revisions):
            self.last_good_due = True  # saved after the reconcile: off the path of a move
        self.assignments, self.assignment_revisions = assignments, revisions
        self.peers = view.peers
        self.have_state = self.policy is not None
        self.pending_view = None

    def _save_last_good(self) -> None:
        self.last_good_due = False
        try:
            save_last_good(self.last_good_path, self.assignments, self.assignment_revisions)
        except OSError as exc:  # only a restart during a damaged record would miss it
            self.log("state-write-failed", {"path": str(self.last_good_path), "error": str(exc)})

    def _use_policy(self, record: PolicyRecord) -> None:
        if record.sha256 in (self.policy_sha, self.refused_policy_sha):
            return
        try:
            policy = load_policy(record.yaml, source="applied policy")
        except PolicyError as exc:  # keep the last good policy rather than stopping work
            self.refused_policy_sha = record.sha256
            self.log("bad-policy", {"sha256": record.sha256[:12], "error": str(exc)})
            return
        self.policy, self.policy_sha = policy, record.sha256
        self._policy_changed()
        self.next_health = 0.0  # check now, and from now on at the policy's interval
        self.log("policy", {"sha256": record.sha256[:12], "applied_by": record.applied_by})

    def _policy_changed(self) -> None:
        assert self.policy is not None
        if self.inventory.source in ("declared", "none"):
            self._read_inventory()
        self.health.ignored_xids = self.policy.health.ignored_xids

    def _read_inventory(self) -> None:
        """NVML's GPUs (the last good ones while it fails), else the count the policy declares."""
        declared = self.policy.hosts.get(self.config.host) if self.policy else None
        self.inventory = self.gpus.reload(declared.gpus if declared else None, self.clock())

    # --- health, reconcile, publish --------------------------------------------

    def _check_health(self, now: float) -> None:
        interval = self.policy.health.interval_seconds if self.policy is not None else 5.0
        self.next_health = now + interval
        assignments = self.assignments if self.have_state else None
        unhealthy = self.gpus.check(now, self.policy, self.config.host, assignments)
        self.inventory = self.gpus.inventory
        if set(unhealthy) != set(self.unhealthy):
            self.log("health", {"unhealthy": {str(k): v for k, v in sorted(unhealthy.items())}})
        self.unhealthy = unhealthy

    def _observe(self, now: float) -> None:
        """Sample GPU usage (unassigned processes, idle holders); hand idle releases to the link."""
        views, roots = self.supervisor.views(), self.supervisor.process_roots()
        state = (self.assignments, self.assignment_revisions, self.unhealthy)
        self.observer.sample(now, self.wall(), self.policy, self.desired, views, roots, *state)
        self.link.release_idle(self.observer.releases)

    def _reap(self) -> None:
        for exited in self.supervisor.tick():
            self.log("exit", as_fields(exited))

    def _reconcile(self, now: float) -> None:
        assert self.policy is not None
        inputs = self._desired_inputs_now()
        if inputs != self._desired_inputs:  # recompute only when something it reads changed
            before = self.desired
            self.desired = desired_jobs(inputs)
            self._desired_inputs = inputs  # only once computed: a failure is retried
            self._history(self.decisions.desired_changed, before, self.desired, self.gpus.pins)
        for job, want in self.desired.items():
            if want.state == "failed" and job not in self.failed:
                self.failed[job] = want.assignment_revision
                self.log("job-failed", {"job": job, "reason": want.message})
        self.failed = {
            j: rev for j, rev in self.failed.items() if self.assignment_revisions.get(j) == rev
        }
        views = self.supervisor.views()
        planned = plan(self.desired, views, now)
        self.mps.carry_out(self.mps.wanted(self.desired, views, self.inventory.gpus or None), now)
        actions = self.mps.hold_starts(planned, self.desired)  # starts wait for their daemons
        for action in actions:
            self.log(action_name(action), action_fields(action))
            self.supervisor.apply(action)
        self._history(self.decisions.actions, actions, self.desired)
        busy = bool(actions) or self.mps.waiting or any(v.stopping for v in views.values())
        if busy and not self.busy:
            self.busy_since = now
        self.busy = busy
        self.reconciled = True

    def _desired_inputs_now(self) -> DesiredInputs:
        assert self.policy is not None
        wall = self.wall()  # reservations are judged by this host's clock
        views = self.supervisor.views()
        assignments = self.assignments
        running = {job for job, view in views.items() if view.alive}
        return DesiredInputs(
            policy=self.policy,
            policy_sha=self.policy_sha,
            host=self.config.host,
            assignments=assignments,
            assignment_revisions=self.assignment_revisions,
            inventory=self.inventory.gpus or None,
            unhealthy=self.unhealthy,
            failed=self.failed,
            now=wall,
            reservations=active_reservations(self.policy, self.config.host, wall),
            holders=gpu_holders(views),
            pinned=self.gpus.pins,
            ports=self.ports.allocate(self.policy, self.config.host, assignments, running),
            master_addr=self.config.local_master_addr,
            peers=self.peers,
            address=self.config.advertised_address,
            allowed_cpus=self.cpus,
            mps_dir=str(self.mps.root),
        )

    def _history(self, decide: Callable[..., list[HistoryEntry]], *args: Any) -> None:
        """Hand the link the history entries ``decide`` finds (it writes them when it can)."""
        entries = decide(*args, self.assignments, format_time(self.wall()))
        if entries and self.policy is not None:
            self.link.record_history(entries, self.policy.history.entries_per_host)

    def _offer(self) -> None:
        """Hand the link what to publish; it writes only what differs from the store."""
        record = agent_record(
            self.config.host,
            self.inventory,
            self.unhealthy,
            started_at=self.started_at,
            version=__version__,
            address=self.config.advertised_address,
            unassigned=self.observer.unassigned,
        )
        running, idle = self.supervisor.records(), self.observer.idle_since
        workers = None
        if self.reconciled:  # before that, the agent does not know yet what it runs
            workers = worker_records(self.config.host, self.desired, running, idle)
        self.link.offer(record, workers)
        self.observer.note(self.inventory, self.unhealthy, self.assignments, running, __version__)
