"""The host agent: watch the store, reconcile, supervise, report.

Level-based: every change, and a periodic full re-read, recomputes the
desired workers from the store and compares them with what runs; the
supervisor carries out the planned actions. The loop sleeps on the watch
queue, so it costs nothing while nothing happens.

Hard rules kept here:

* A store outage never stops a worker: the last known assignment stays in
  force, the agent retries with capped, jittered backoff, says it is stale,
  and resumes the watch from its last revision (after a compaction, it
  re-reads everything).
* Adoption happens before the first plan, so a restarted agent never runs a
  second copy of a worker.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import datetime
from types import FrameType
from typing import Any

from allocator import __version__
from allocator.agent.claims import gpu_holders
from allocator.agent.config import AgentConfig
from allocator.agent.desired import desired_jobs
from allocator.agent.gpu_state import GpuState
from allocator.agent.link import Message, RetryTimer, WatchError, WatchThread, start_watches
from allocator.agent.log import DecisionLog, action_fields, action_name, as_fields
from allocator.agent.model import DesiredJob
from allocator.agent.ports import PortTable
from allocator.agent.publisher import Publisher
from allocator.agent.reconcile import plan
from allocator.agent.report import agent_record, worker_records
from allocator.agent.supervisor import Supervisor
from allocator.errors import (
    AllocatorError,
    BadRecord,
    Compacted,
    LeaseLost,
    PolicyError,
    StoreError,
)
from allocator.gpus.inventory import Inventory
from allocator.identity import format_time, utc_now
from allocator.keys import KeyLayout
from allocator.policy import Policy, load_policy
from allocator.records import Assignment, PolicyRecord, decode_record
from allocator.reservations import active_reservations
from allocator.store import Store, open_store, resolve_store_url

__all__ = ["Agent"]

#: The longest the loop sleeps before reaping exits and checking timers.
TICK_SECONDS = 0.2
#: How often it looks while workers are being stopped or started: a replacement
#: starts as soon as the old process group is gone.
BUSY_TICK_SECONDS = 0.005


class Agent:
    """One host's agent. ``run()`` returns when SIGTERM/SIGINT arrives."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
        environ: Mapping[str, str] | None = None,
        reload_config: Callable[[], AgentConfig] | None = None,
    ) -> None:
        self.config = config
        self.reload_config = reload_config
        self.clock = clock
        self.wall = wall
        self.environ = dict(os.environ if environ is None else environ)
        self.layout = KeyLayout(config.prefix)
        self.url = resolve_store_url(config.store)
        self.log = DecisionLog(config.log_format, config.host)
        config.agent_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(
            config.worker_log_dir, config.agent_dir / "workers.json", clock=clock, logger=self.log
        )
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.store: Store | None = None
        self.watches: list[WatchThread] = []
        self.revision = 0
        self.policy: Policy | None = None
        self.policy_sha = ""
        self.assignments: dict[str, Assignment] = {}
        self.assignment_revisions: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.desired: dict[str, DesiredJob] = {}
        self.gpus = GpuState(self.environ, config.agent_dir / "gpus.json", self.log, clock())
        self.ports = PortTable(config.agent_dir / "ports.json", self.log)
        self.inventory: Inventory = self.gpus.inventory
        self.health = self.gpus.monitor
        self.unhealthy: dict[int, str] = dict(self.gpus.unhealthy)
        self.publisher = Publisher(self.layout, config.host, self.log)
        self.started_at = format_time(wall())
        self.connected = False
        self.have_state = False
        self.retry = RetryTimer(config.retry_max_seconds)
        self.next_connect = 0.0
        self.next_resync = 0.0
        self.next_heartbeat = 0.0
        self.next_health = 0.0
        self.stop_requested = False
        self.reload_requested = False
        self.busy = False
        self._desired_inputs: tuple[Any, ...] = ()
        self.bad_seen: dict[str, int] = {}

    # --- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Adopt, then watch-reconcile until asked to stop; return an exit code."""
        self._install_signal_handlers()
        report = self.supervisor.adopt()
        self.log("adopt", {"adopted": sorted(report.adopted), "stale": sorted(report.stale)})
        self.log(
            "start", {"store": self.url, "version": __version__, "inventory": self.inventory.source}
        )
        try:
            while not self.stop_requested:
                self._step()
        finally:
            self._shutdown()
        return 0

    def _step(self) -> None:
        now = self.clock()
        if self.reload_requested:
            self._reload()
        if not self.connected and now >= self.next_connect:
            self._connect(now)
        elif self.connected and now >= self.next_resync:
            self._guarded(self._full_read)
        self._drain(self._sleep_for(self.clock()))
        now = self.clock()
        if now >= self.next_health:
            self._check_health(now)
        for exited in self.supervisor.tick():
            self.log("exit", as_fields(exited))
        if self.have_state:
            self._reconcile(self.clock())
        if self.connected:
            self._guarded(lambda: self._publish(self.clock()))

    def _sleep_for(self, now: float) -> float:
        due = [self.next_health]
        if not self.connected:
            due.append(self.next_connect)
        tick = BUSY_TICK_SECONDS if self.busy else TICK_SECONDS
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
        errors = [m for m in messages if isinstance(m, WatchError)]
        if errors:
            self._on_watch_error(errors[0].error)
        elif self.connected:
            self._guarded(self._full_read)

    # --- the store -----------------------------------------------------------

    def _connect(self, now: float) -> None:
        try:
            if self.store is None:
                self.store = open_store(self.url)
            self._full_read()
            self._start_watches()
            self.connected = True
            self.retry.succeeded()
            self.next_heartbeat = now
            self.log("store-connected", {"store": self.url, "revision": self.revision})
        except AllocatorError as exc:
            self._disconnected(exc)

    def _full_read(self) -> None:
        """Re-read the host's assignments, then the policy (level-based)."""
        store = self._require_store()
        listing = store.list(self.layout.host_jobs(self.config.host))
        assignments: dict[str, Assignment] = {}
        revisions: dict[str, int] = {}
        for item in listing.items:
            job = item.key.rsplit("/", 1)[-1]
            try:
                assignments[job] = decode_record(
                    item.value, Assignment, item.key, job=job, host=self.config.host
                )
                revisions[job] = item.mod_revision
            except BadRecord as exc:
                self._bad_record(exc, item.mod_revision)
        self._read_policy(store)
        self.assignments, self.assignment_revisions = assignments, revisions
        self.revision = max(self.revision, listing.revision)
        self.have_state = self.policy is not None
        self.next_resync = self.clock() + self.config.resync_seconds

    def _read_policy(self, store: Store) -> None:
        item = store.get(self.layout.policy)
        if item is None:
            if self.policy is None:
                self.log("no-policy", {"hint": "run `allocator policy apply FILE`"})
            return
        try:
            record = decode_record(item.value, PolicyRecord, item.key)
        except BadRecord as exc:  # keep the last good policy: a damaged record stops no work
            self._bad_record(exc, item.mod_revision)
            return
        if record.sha256 == self.policy_sha:
            return
        try:
            self.policy = load_policy(record.yaml, source="applied policy")
        except PolicyError as exc:  # keep the last good policy rather than stopping work
            self.log("bad-policy", {"error": str(exc)})
            return
        self.policy_sha = record.sha256
        self._policy_changed()
        self.log("policy", {"sha256": record.sha256[:12], "applied_by": record.applied_by})

    def _bad_record(self, error: BadRecord, revision: int) -> None:
        """Log a skipped record once per version of it, not on every re-read."""
        if self.bad_seen.get(error.key) != revision:
            self.bad_seen[error.key] = revision
            self.log("bad-record", {"key": error.key, "revision": revision, "error": error.reason})

    def _policy_changed(self) -> None:
        assert self.policy is not None
        if self.inventory.source in ("declared", "none"):
            self._read_inventory()
        self.health.ignored_xids = self.policy.health.ignored_xids

    def _read_inventory(self) -> None:
        """NVML's GPUs (the last good ones while it fails), else the count the policy declares."""
        declared = self.policy.hosts.get(self.config.host) if self.policy else None
        self.inventory = self.gpus.reload(declared.gpus if declared else None, self.clock())

    def _start_watches(self) -> None:
        self._stop_watches()
        prefixes = [self.layout.host_jobs(self.config.host), self.layout.policy]
        self.watches = start_watches(
            lambda: open_store(self.url), prefixes, self.revision + 1, self.inbox
        )

    def _stop_watches(self) -> None:
        for watch in self.watches:
            watch.stop()
        self.watches = []
        while not self.inbox.empty():
            self.inbox.get_nowait()

    def _on_watch_error(self, error: AllocatorError) -> None:
        if isinstance(error, Compacted):
            self.log(
                "watch-compacted", {"revision": self.revision, "compact": error.compact_revision}
            )
            self.revision = 0
            try:
                self._full_read()
                self._start_watches()
            except AllocatorError as exc:
                self._disconnected(exc)
            return
        self._disconnected(error)

    def _disconnected(self, error: AllocatorError) -> None:
        was_connected = self.connected
        self.connected = False
        self._stop_watches()
        if self.store is not None:
            self.store.close()
            self.store = None
        self.next_connect = self.retry.failed(self.clock())
        self.log(
            "store-unavailable",
            {
                "error": " ".join(str(error).split()),
                "stale": True,
                "keeping_workers": len(self.supervisor.views()),
                "retry_in": round(self.next_connect - self.clock(), 2),
                "first": not was_connected,
            },
        )

    def _guarded(self, operation: Callable[[], None]) -> None:
        try:
            operation()
        except LeaseLost:
            self.publisher.lease = None
        except AllocatorError as exc:
            self._disconnected(exc)

    def _require_store(self) -> Store:
        if self.store is None:
            raise StoreError("not connected")
        return self.store

    # --- health, reconcile, publish --------------------------------------------

    def _check_health(self, now: float) -> None:
        interval = self.policy.health.interval_seconds if self.policy is not None else 5.0
        self.next_health = now + interval
        assignments = self.assignments if self.have_state else None
        unhealthy = self.gpus.check(now, self.policy, self.config.host, assignments)
        self.inventory = self.gpus.inventory
        if set(unhealthy) != set(self.unhealthy):
            self.log("health", {"unhealthy": {str(k): v for k, v in sorted(unhealthy.items())}})
            self.next_heartbeat = now  # publish it now: `allocator set count=N` reads it
        self.unhealthy = unhealthy

    def _reconcile(self, now: float) -> None:
        assert self.policy is not None
        wall = self.wall()  # reservations are judged by this host's clock
        views = self.supervisor.views()
        holders = gpu_holders(views)
        inputs = (
            self.policy_sha,
            tuple(sorted(self.assignment_revisions.items())),
            self.inventory,
            tuple(sorted(self.unhealthy.items())),
            tuple(sorted(self.failed.items())),
            active_reservations(self.policy, self.config.host, wall),  # windows opening
            tuple(sorted(holders.items())),
            tuple(sorted(self.gpus.pins)),
            self.config.master_addr,
        )
        if inputs != self._desired_inputs:  # recompute only when something it reads changed
            self._desired_inputs = inputs
            self.desired = desired_jobs(
                self.policy,
                self.config.host,
                self.assignments,
                self.assignment_revisions,
                self.inventory.gpus or None,
                self.unhealthy,
                self.failed,
                wall,
                holders=holders,
                pinned=self.gpus.pins,
                ports=self.ports.allocate(
                    self.policy,
                    self.config.host,
                    self.assignments,
                    running={job for job, view in views.items() if view.alive},
                ),
                master_addr=self.config.master_addr,
            )
        for job, want in self.desired.items():
            if want.state == "failed" and job not in self.failed:
                self.failed[job] = want.assignment_revision
                self.log("job-failed", {"job": job, "reason": want.message})
        self.failed = {
            j: rev for j, rev in self.failed.items() if self.assignment_revisions.get(j) == rev
        }
        views = self.supervisor.views()
        actions = plan(self.desired, views, now)
        for action in actions:
            self.log(action_name(action), action_fields(action))
            self.supervisor.apply(action)
        self.busy = bool(actions) or any(v.stopping for v in views.values())

    def _publish(self, now: float) -> None:
        store = self._require_store()
        if now >= self.next_heartbeat:
            record = agent_record(
                self.config.host,
                self.inventory,
                self.unhealthy,
                heartbeat_at=format_time(self.wall()),
                started_at=self.started_at,
                version=__version__,
            )
            self.publisher.heartbeat(store, record, self.config.lease_ttl)
            self.next_heartbeat = now + self.config.heartbeat_seconds
        records = worker_records(self.config.host, self.desired, self.supervisor.records())
        self.publisher.workers(store, records)

    # --- signals, reload, shutdown -----------------------------------------------

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, _frame: FrameType | None) -> None:
            self.stop_requested = True

        def reload(signum: int, _frame: FrameType | None) -> None:
            self.reload_requested = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def _reload(self) -> None:
        """SIGHUP: re-read settings, inventory and the store state; workers are left alone."""
        self.reload_requested = False
        self._reload_settings()
        self._read_inventory()
        self.log("reload", {"inventory": self.inventory.source, "gpus": len(self.inventory.gpus)})
        if self.connected:
            self._guarded(self._full_read)

    def _reload_settings(self) -> None:
        if self.reload_config is None:
            return
        try:
            new = self.reload_config()
        except AllocatorError as exc:  # a typo in the file must not take the agent down
            self.log("reload-refused", {"error": str(exc)})
            return
        fixed = ("host", "store", "prefix", "state_dir", "log_dir")
        ignored = [name for name in fixed if getattr(new, name) != getattr(self.config, name)]
        if ignored:
            self.log("reload-needs-restart", {"settings": ignored})
            new = replace(new, **{name: getattr(self.config, name) for name in ignored})
        self.config = new
        self.log.fmt = new.log_format
        self.retry = RetryTimer(new.retry_max_seconds)
        self.log("settings", {k: str(v) for k, v in asdict(new).items()})

    def _shutdown(self) -> None:
        self._stop_watches()
        if self.config.keep_workers_on_exit:
            self.log("exit-keeping-workers", {"jobs": sorted(self.supervisor.views())})
        else:
            self.log("stopping-workers", {"jobs": sorted(self.supervisor.views())})
            self.supervisor.stop_all()
        if self.store is not None:
            self._guarded(self._final_report)
        if self.store is not None:
            self.store.close()
        self.health.close()
        self.log("stopped", {})

    def _final_report(self) -> None:
        self.publisher.withdraw(
            self._require_store(), keep_worker_records=self.config.keep_workers_on_exit
        )
