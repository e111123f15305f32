"""Keeps a :class:`~allocator.serve.mirror.FleetMirror` current from the store, in a thread.

One read of what the mirror keeps (:mod:`allocator.serve.fleet_read`), then
one watch from the revision after it; every batch of
events updates the mirror and calls ``on_change`` once. When the store goes
away the mirror keeps the last state it had, :attr:`FleetWatcher.state`
says since when the store is unavailable and why, and the watcher tries
again with capped, jittered backoff (the agent's timer). A compacted watch
means "read everything again", not an outage.

A store can also hang rather than go away (a stopped etcd keeps its
connections open and says nothing): a watch cannot tell that from a quiet
fleet. So a watch quiet for :data:`QUIET_SECONDS` is checked with one
keys-only read of the policy key, which has the store's own call deadline
(etcd: ``timeout``, 5 s by default). A store that hung is therefore shown
as unavailable within ``QUIET_SECONDS`` plus that deadline plus one
:data:`POLL_SECONDS` (10.5 s by default; 6.6-10 s measured against a
SIGSTOPped etcd), and as up again at the first read that succeeds after it
resumes (under a second measured).
The check costs one small read per quiet interval, none while events flow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from allocator.errors import AllocatorError, Compacted
from allocator.serve.mirror import FleetMirror
from allocator.store import Event, Read, Store, Watch
from allocator.store.credentials import redact
from allocator.util.retry_timer import RetryTimer
from allocator.util.times import format_time, utc_now

__all__ = ["POLL_SECONDS", "QUIET_SECONDS", "FleetWatcher", "StoreState"]

#: How long one wait on the watch lasts before the watcher checks whether to stop.
POLL_SECONDS = 0.5
#: A watch without events for this long is checked with a read (see the module doc).
QUIET_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class StoreState:
    """Whether the store answers; since when it does not, and why (secrets masked)."""

    up: bool
    since: str | None = None
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"up": self.up, "unavailable_since": self.since, "error": self.error or None}


class FleetWatcher:
    """A daemon thread that reads and watches the fleet's keys into ``mirror``."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        mirror: FleetMirror,
        on_change: Callable[[], None],
        *,
        wall: Callable[[], datetime] = utc_now,
        retry_max_seconds: float = 4.0,
        quiet_seconds: float = QUIET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_store = open_store
        self._quiet_seconds = quiet_seconds
        self._clock = clock
        self.mirror = mirror
        self._on_change = on_change
        self._wall = wall
        self._retry = RetryTimer(retry_max_seconds)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet watch", daemon=True)
        self.state = StoreState(up=False, since=format_time(wall()), error="not read yet")
        self.down_since_monotonic: float | None = time.monotonic()

    def start(self) -> None:
        """Start reading and watching."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop within one poll of the watch."""
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._session()
            except Compacted:
                continue  # read everything again at once
            except AllocatorError as exc:
                self._down(exc)
            except Exception as exc:  # a bug here must not end the page's data for good
                self._down(exc)
            delay = self._retry.failed(time.monotonic()) - time.monotonic()
            self._stopping.wait(max(0.0, delay))

    def _session(self) -> None:
        store = self._open_store()
        try:
            from allocator.serve.fleet_read import read_fleet

            root = f"{self.mirror.layout.root}/"
            listing = read_fleet(store, self.mirror.layout)
            self.mirror.reset(listing)
            self._up()
            self._retry.connected(time.monotonic())
            self._on_change()
            watch = store.watch(root, listing.revision + 1)
            try:
                self._follow(store, watch)
            finally:
                watch.close()
        finally:
            store.close()

    def _follow(self, store: Store, watch: Watch) -> None:
        """Apply the watch's events until stopped; check the store when the watch is quiet."""
        heard = self._clock()
        while not self._stopping.is_set():
            events = watch.next(POLL_SECONDS)
            if events:
                heard = self._clock()
                if self.mirror.apply(events, self._leases(store, events)):
                    self._on_change()
            elif self._clock() - heard >= self._quiet_seconds:
                # Raises StoreUnavailable past the store's deadline if it hung.
                store.read_many([Read(self.mirror.layout.policy, values=False)])
                heard = self._clock()

    def _leases(self, store: Store, events: list[Event]) -> dict[str, int | None]:
        """The lease of each agent key put by ``events`` (an agent lives by its lease)."""
        leases: dict[str, int | None] = {}
        for event in events:
            if (
                event.type == "put"
                and event.key.endswith("/agent")
                and self.mirror.keeps(event.key)
            ):
                item = store.get(event.key)
                leases[event.key] = item.lease if item is not None else None
        return leases

    def _up(self) -> None:
        self.state = StoreState(up=True)
        self.down_since_monotonic = None

    def _down(self, error: Exception) -> None:
        text = redact(" ".join(str(error).split()) or type(error).__name__)
        since = self.state.since if not self.state.up and self.state.since else None
        self.state = StoreState(up=False, since=since or format_time(self._wall()), error=text)
        if self.down_since_monotonic is None:
            self.down_since_monotonic = time.monotonic()
        self._on_change()
