"""The agent's store link: every store call the agent makes, in a thread of its own.

The supervision loop (reaping, SIGKILL escalation, crash restarts, signals,
the systemd watchdog) must keep its tick while a store endpoint hangs, so it
never calls the store. This thread connects, reads, watches, keeps the lease
alive and publishes; it hands each decoded read (:class:`HostView`) to the
loop through a queue, and takes what to publish from an
:class:`~allocator.agent.sync.outbox.Outbox` the loop fills. Store handles
live and die in this thread (SQLite connections must not cross threads;
each watch thread opens its own).

What counts as what:

* only a :class:`~allocator.errors.Retryable` error (unavailable, lease lost)
  is an outage: drop the connection, retry with capped, jittered backoff
  that is forgiven only after a healthy period;
* a refused permission is said plainly and retried slowly (at the cap);
* a compacted watch means "re-read everything", not an outage; a refused
  watch (a role that grants a key but not the prefix a watch ranges over)
  is logged once and left to the periodic resync;
* a record or key the agent cannot use is a bad record, skipped and logged
  once per version (see :mod:`allocator.agent.sync.host_records`), never an error here;
* another host of a job across hosts is read (:mod:`allocator.agent.sync.peer_reads`)
  and watched with this host's keys; a refusal to read it is logged once and
  leaves that host unknown, never stale;
* a refused request (:data:`~allocator.agent.sync.link_failures.REFUSALS`:
  the policy, a validation, a conflict, a missing record, a value too large)
  is logged and leaves the connection, watches and lease as they are: the
  store answered, so it is no outage, and tearing the link down would stall
  everything else it writes;
* another failure of a setting is logged and retried with backoff;
* anything else is a bug: logged with its traceback, retried with backoff
  (:func:`~allocator.agent.sync.link_failures.judge` decides which is which).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, assert_never

from allocator.agent.config import AgentConfig
from allocator.agent.planning.types import IdleRelease
from allocator.agent.sync.history_queue import PER_TICK, HistoryQueue, write_pending
from allocator.agent.sync.host_records import host_view
from allocator.agent.sync.idle_releaser import IdleReleaser
from allocator.agent.sync.link_failures import judge
from allocator.agent.sync.link_phase import (
    Connected,
    Connecting,
    LinkPhase,
    Outage,
    Refused,
    Resyncing,
    Stopped,
    Watching,
    read_due_now,
    with_store,
)
from allocator.agent.sync.messages import Close, LinkState, Settings, ToLink, ToLoop, Wake
from allocator.agent.sync.outbox import Outbox
from allocator.agent.sync.pacing import Pacing, pacing
from allocator.agent.sync.peer_reads import read_peers
from allocator.agent.sync.policy_read import PolicyRead, PolicyReader, SharedPolicy
from allocator.agent.sync.publisher import Publisher
from allocator.agent.sync.reports import host_counts
from allocator.agent.sync.watches import (
    WatchError,
    WatchEvents,
    WatchThread,
    agent_watch_keys,
    start_watches,
)
from allocator.errors import (
    AllocatorError,
    BadRecord,
    Compacted,
    PermissionDenied,
)
from allocator.policy.model import HistorySettings
from allocator.records.codec import encode_record, replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, HistoryEntry
from allocator.store import Store, bad_key_records
from allocator.util.retry_timer import RetryTimer

__all__ = ["RUN_READ_SECONDS", "StoreLink"]

Log = Callable[[str, dict[str, Any]], None]

#: How often the host is re-read while ``allocator run`` holds GPUs on it.
RUN_READ_SECONDS = 1.0


class StoreLink:
    """One agent's connection to the store, run in a daemon thread."""

    def __init__(
        self,
        config: AgentConfig,
        url: str,
        log: Log,
        to_loop: queue.Queue[ToLoop],
        *,
        open_store: Callable[[str], Store],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.url = url
        self.layout = KeyLayout(config.prefix)
        self.log = log
        self.to_loop = to_loop
        self.outbox = Outbox()
        self.history = HistoryQueue(log)
        self._open_store = open_store
        self._clock = clock
        self._inbox: queue.Queue[ToLink] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="store link", daemon=True)
        self.publisher = Publisher(self.layout, config.host, log)
        self.releaser = IdleReleaser(self.layout, config.host, log)
        self.retry = RetryTimer(config.retry_max_seconds)
        self.phase: LinkPhase = Connecting()  # see link_phase: store handle and read timer
        self.watches: list[WatchThread] = []
        self.watched_peers: tuple[str, ...] = ()
        self.refused_peers: set[str] = set()
        self.refused_watches: set[str] = set()  # said once each
        self.epoch = 0
        self.next_keepalive = 0.0
        self.fleet_hosts = 0  # as the policy's common share last said
        self.pacing: Pacing = pacing(config, 0)
        self.revision = 0
        self.bad_seen: dict[str, int] = {}
        self.policy_reader = PolicyReader(self.layout, config.host)
        self.whole_policy = False  # no shares stored: the whole policy record is watched
        self.assignments: Mapping[str, Assignment] = {}  # as the last read found them

    # --- the loop's side -------------------------------------------------------

    def start(self) -> None:
        """Start connecting in the background."""
        self._thread.start()

    def offer(
        self,
        agent: AgentRecord,
        workers: Mapping[str, bytes] | None,
        utilisation: int | None = None,
    ) -> None:
        """Publish this content (only what differs from the store is written)."""
        if self.outbox.offer(agent, workers, utilisation):
            self._inbox.put(Wake())

    def release_idle(self, releases: Sequence[IdleRelease]) -> None:
        """Release these idle holders (each only while its assignment is the one judged)."""
        if self.releaser.offer(releases):
            self._inbox.put(Wake())

    def record_history(
        self,
        entries: Iterable[HistoryEntry],
        keep: HistorySettings | None,
        unless_ended_after: int | None = None,
    ) -> None:
        """Append the agent's decisions to the host's history (queued; written when connected).

        ``unless_ended_after``: see :meth:`HistoryQueue.add`.
        """
        if self.history.add(entries, keep, unless_ended_after):
            self._inbox.put(Wake())

    def resync(self) -> None:
        """Re-read everything soon (SIGHUP)."""
        self._inbox.put(Wake(resync=True))

    def reconfigure(self, config: AgentConfig) -> None:
        """Apply reloaded timing settings (the store, host and prefix stay)."""
        self._inbox.put(Settings(config))

    def close(self, *, keep_worker_records: bool, timeout: float) -> bool:
        """Withdraw (revoke the lease, drop worker records unless kept) and stop.

        Returns ``False`` when the link did not finish within ``timeout``
        seconds (a store that does not answer): the lease then expires on its own.
        """
        self._inbox.put(Close(keep_worker_records))
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            messages = self._wait(self._sleep_for(self._clock()))
            closing = next((m for m in messages if isinstance(m, Close)), None)
            try:
                self._handle(messages)
                if closing is None:
                    self._tick(self._clock())
            except Exception as exc:  # every failure is classified; none ends the thread
                self._failed(exc)
            if closing is not None:
                self._finish(closing)
                return

    def _wait(self, timeout: float) -> list[ToLink]:
        try:
            messages = [self._inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _sleep_for(self, now: float) -> float:
        match self.phase:
            case Connecting(retry_at=due) | Outage(retry_at=due):
                pass
            case Watching(read_at=read_at) | Refused(read_at=read_at):
                due = min(self.next_keepalive, read_at)
            case Resyncing() | Stopped():  # never waited in: a connect reads at once
                due = now
            case _:
                assert_never(self.phase)
        return max(0.0, due - now)

    def _handle(self, messages: list[ToLink]) -> None:
        for message in messages:
            match message:
                case Settings():
                    self._apply_settings(message.config)
                case Wake():
                    if message.resync:
                        self.phase = read_due_now(self.phase)
                case Close():
                    pass  # taken by _run, after the rest
                case WatchEvents():
                    if message.epoch == self.epoch:  # an old watch's events are ignored
                        self.phase = read_due_now(self.phase)
                case WatchError():
                    if message.epoch == self.epoch:  # an old watch's error is ignored
                        self._watch_failed(message.prefix, message.error)
                case _:
                    assert_never(message)

    def _watch_failed(self, prefix: str, error: AllocatorError) -> None:
        if isinstance(error, PermissionDenied):
            # Reads work (the link is up) but this watch is refused (a role that grants
            # the policy key alone, not as the prefix a watch ranges over): the periodic
            # resync still reads it. Ending the link would only repeat the refusal.
            if prefix not in self.refused_watches:
                self.refused_watches.add(prefix)
                hint = f"grant this agent read access to {prefix} as a prefix"
                self.log("watch-refused", {"prefix": prefix, "error": str(error), "hint": hint})
            return
        if not isinstance(error, Compacted):
            raise error
        self.log("watch-compacted", {"revision": self.revision, "compact": error.compact_revision})
        self._stop_watches()
        self.phase = read_due_now(self.phase)

    def _apply_settings(self, config: AgentConfig) -> None:
        self.config = config
        self.retry = RetryTimer(config.retry_max_seconds)
        self.pacing = pacing(config, self.fleet_hosts)
        if isinstance(self.phase, Connected):
            read_at = min(self.phase.read_at, self._clock() + self.pacing.resync_seconds)
            self.phase = replace(self.phase, read_at=read_at)
        self.next_keepalive = min(self.next_keepalive, self._clock() + self._heartbeat())

    def _heartbeat(self) -> float:
        """The keep-alive interval: the pacing's, within the granted lease's TTL.

        A lease granted before the fleet's size was known (a shorter TTL) is
        kept alive at the settings' ratio until :meth:`Publisher.keep_alive`
        grants the longer one.
        """
        granted = self.publisher.granted_ttl or self.pacing.lease_ttl
        ratio = self.config.heartbeat_seconds / self.config.lease_ttl
        return min(self.pacing.heartbeat_seconds, granted * ratio)

    def _paced_by(self, policy: PolicyRead) -> None:
        """Take the fleet's size from the policy's common share, if it says one."""
        if isinstance(policy.policy, SharedPolicy):
            hosts = policy.policy.common_policy.fleet_hosts
            if hosts != self.fleet_hosts:
                self.fleet_hosts = hosts
                self.pacing = pacing(self.config, hosts)

    def _tick(self, now: float) -> None:
        phase = self.phase
        if isinstance(phase, Connecting | Outage):
            if now < phase.retry_at:
                return
            self._connect(now)
        store = self._require_store()
        if not isinstance(self.phase, Connected) or now >= self.phase.read_at:
            self._read(store, now)
        if now >= self.next_keepalive:
            self.publisher.keep_alive(store, self.pacing.lease_ttl)
            self.next_keepalive = now + self._heartbeat()
        self._publish(store)
        self.releaser.run(store)
        if write_pending(store, self.layout, self.config.host, self.history, self.log) == PER_TICK:
            self._inbox.put(Wake())  # more are waiting: write them after what else is due

    def _connect(self, now: float) -> None:
        lost_since = self.phase.since if isinstance(self.phase, Outage) else None
        store = self._open_store(self.url)
        self.phase = Resyncing(store, lost_since)
        self.publisher.keep_alive(store, self.pacing.lease_ttl)
        self.next_keepalive = now + self._heartbeat()
        self._read(store, now)  # Watching, or Refused
        self.retry.connected(now)
        self.log("store-connected", {"store": self.url, "revision": self.revision})
        self.to_loop.put(LinkState(True, f"connected at revision {self.revision}"))

    def _read(self, store: Store, now: float) -> None:
        """One level-based read of the host and the policy; watches start after the first."""
        read_at = now + self.pacing.resync_seconds
        if isinstance(self.phase, Connected):  # not again at once, whatever this read meets
            self.phase = replace(self.phase, read_at=read_at)
        try:
            listing, policy = self.policy_reader.read(store)
        except PermissionDenied as exc:
            self._refused(store, exc, now)
            return
        self._paced_by(policy)
        read_at = now + self.pacing.resync_seconds
        view = host_view(listing, None, self.layout, self.config.host, read=policy)
        peers, bad = read_peers(
            store, self.layout, view, self.config.host, self.refused_peers, self.log
        )
        view = replace(view, peers=peers, bad=(*view.bad, *bad))
        self.revision = view.revision  # the store's own, even if it went back (a restore)
        self.publisher.observe(view.own)
        was_refused = isinstance(self.phase, Refused)
        self.phase = Watching(store, read_at)
        self.assignments = view.assignments
        if was_refused:
            self.log("store-readable", {"revision": self.revision})
        for error, revision in view.bad:
            self._bad_record(error, revision)
        for error in bad_key_records(listing):  # skipped by the store: a key that is not text
            self._bad_record(error, 0)
        self.to_loop.put(view)
        if any(held.run is not None for held in view.assignments.values()):
            # A run-held assignment ends when its lease expires, and a store may delete
            # an expired lease's keys only at its next write (SQLite): read again soon,
            # so a killed run's end is seen, and recorded, when its lease runs out.
            self.phase = Watching(store, min(read_at, now + RUN_READ_SECONDS))
        # A host the store will not show is not watched either: a refused watch would
        # read as this agent's own permission problem and drop the connection.
        watched = tuple(host for host, peer in peers.items() if peer.readable)
        if not self.watches or (watched, policy.whole) != (self.watched_peers, self.whole_policy):
            self.whole_policy = policy.whole
            self._start_watches(watched)

    def _refused(self, store: Store, error: PermissionDenied, now: float) -> None:
        """Reads refused but the lease works: say so in the record, retry slowly."""
        phase = self.phase
        own_read = isinstance(phase, Watching) or (isinstance(phase, Refused) and phase.own_read)
        self.phase = Refused(store, now + self.retry.cap_seconds, own_read)
        self.log(
            "store-permission-denied",
            {
                "error": " ".join(str(error).split()),
                "hint": "grant this agent read access to its host's keys, "
                "its policy shares and the policy",
                "retry_in": self.retry.cap_seconds,
            },
        )

    def _bad_record(self, error: BadRecord, revision: int) -> None:
        """Log a skipped record once per version of it, not on every re-read."""
        if self.bad_seen.get(error.key) != revision:
            self.bad_seen[error.key] = revision
            self.log("bad-record", {"key": error.key, "revision": revision, "error": error.reason})

    def _publish(self, store: Store) -> None:
        agent, workers, utilisation = self.outbox.take()
        phase = self.phase
        stale = isinstance(phase, Refused)
        encoded = encode_record(replace_struct(agent, store_stale=stale)) if agent else None
        own_read = isinstance(phase, Watching) or (isinstance(phase, Refused) and phase.own_read)
        if not own_read or workers is None:
            self.publisher.publish(store, encoded, None)
            return
        counts = None
        if agent is not None:
            counts = host_counts(agent, workers, self.assignments, utilisation)
        self.publisher.publish(store, encoded, workers, counts)

    def _start_watches(self, peers: tuple[str, ...] = ()) -> None:
        self._stop_watches()
        self.watched_peers = peers
        host, whole = self.config.host, self.whole_policy
        prefixes = list(agent_watch_keys(self.layout, host, whole_policy=whole))
        prefixes += [self.layout.host(peer) for peer in peers]
        self.watches = start_watches(
            lambda: self._open_store(self.url), prefixes, self.revision + 1, self._inbox, self.epoch
        )

    def _stop_watches(self) -> None:
        for watch in self.watches:
            watch.stop()
        self.watches = []
        self.epoch += 1  # whatever the old watches still send is ignored

    # --- failures and the end ------------------------------------------------------

    def _failed(self, error: Exception) -> None:
        before = self.phase
        was_connected = isinstance(before, Connected)
        has_store = with_store(before) is not None
        verdict = judge(error, connected=was_connected, has_store=has_store)
        if verdict.action == "lease":  # a write under a lease that expired meanwhile
            self.log(verdict.event, {"lease": self.publisher.lease, **verdict.fields})
            self.publisher.lease_lost()
            self.next_keepalive = self._clock()
            return
        if verdict.action == "refused":  # the store answered "no" to one request
            self.log(verdict.event, verdict.fields)
            return
        self._drop()
        now = self._clock()
        retry_at = self.retry.failed_slowly(now) if verdict.slowly else self.retry.failed(now)
        self.phase = _after_failure(before, now, retry_at)
        fields = {**verdict.fields, "retry_in": round(retry_at - now, 2)}
        self.log(verdict.event, {**fields, "first": not was_connected})
        if was_connected:
            self.to_loop.put(LinkState(False, verdict.text))

    def _drop(self) -> None:
        self._stop_watches()
        self.publisher.forget()
        store, self.phase = with_store(self.phase), Stopped()  # the caller says what follows
        if store is not None:
            try:
                store.close()
            except Exception as exc:  # closing a broken connection may fail too; it is gone
                self.log("store-close-failed", {"error": str(exc)})

    def _finish(self, closing: Close) -> None:
        self._stop_watches()
        store = with_store(self.phase)
        if store is not None:
            try:
                write_pending(store, self.layout, self.config.host, self.history, self.log)
                if closing.keep_worker_records:  # the records stay: make them current first
                    self._publish(store)
                self.publisher.withdraw(store, keep_worker_records=closing.keep_worker_records)
            except Exception as exc:  # the lease expires on its own; nothing else to do
                self.log("withdraw-failed", {"error": " ".join(str(exc).split())})
        if self.history:
            reason = "the store did not take them before the agent stopped"
            self.log("history-unwritten", {"entries": len(self.history), "reason": reason})
        self._drop()

    def _require_store(self) -> Store:
        store = with_store(self.phase)
        assert store is not None
        return store


def _after_failure(before: LinkPhase, now: float, retry_at: float) -> LinkPhase:
    """Where a link that was in ``before`` is after a failure that dropped its connection."""
    match before:
        case Watching() | Refused():
            return Outage(now, retry_at)
        case Outage(since=since) | Resyncing(lost_since=float() as since):
            return Outage(since, retry_at)
        case _:
            return Connecting(retry_at)
