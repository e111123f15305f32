"""A waiter's place in line: its entries, the lease that keeps them, and the watch it waits on.

One request waits in one host's queue; a job across hosts (a gang) waits
in the queue of every one of its hosts at once. Either way its entries are
written in one transaction, under one store lease that a thread keeps
alive (a waiter that dies leaves every queue when the lease expires), with
the same name, priority, fair-share factor and creating revision on every
host: so any two gangs sort alike in every queue they share, and the one
first on one host is first on all (no two gangs each hold the other up).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from allocator.control.holder import priority_of
from allocator.errors import AllocatorError, LeaseLost
from allocator.recipes.queue.share import read_share
from allocator.records.codec import replace_struct
from allocator.records.holders import QueueEntry
from allocator.store import Put, Watch
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.placement.choose import Request
    from allocator.recipes.context import Context

__all__ = ["Ticket"]


class Ticket:
    """This waiter's queue entries (one per host of ``hosts``), their lease and its watch."""

    def __init__(
        self, allocator: Context, request: Request, hosts: Sequence[str], ttl: float
    ) -> None:
        self.allocator, self.request, self.ttl = allocator, request, ttl
        self.hosts = tuple(hosts)
        self.lease: int | None = None
        self.keys: dict[str, str] = {}
        self.lost = False
        #: An entry of this ticket may have been deleted (a cancel), or the watch
        #: that would have said so broke: the waiter reads the tombstone once.
        self.maybe_removed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Watch | None = None

    def join(self) -> dict[str, str]:
        """Write the entries (new lease, new arrival) in one transaction; their keys by host."""

        allocator, request = self.allocator, self.request
        layout, store = allocator.layout, allocator.store
        policy = allocator.require_policy().policy
        share = read_share(allocator, policy, allocator.holder)  # before the lease: a slow read
        self.leave()
        self.lost = False
        self._stop = threading.Event()
        self.lease = store.grant_lease(self.ttl)
        name = secrets.token_hex(8)  # the same on every host: a tie sorts alike everywhere
        self.keys = {host: layout.queue_entry(host, name) for host in self.hosts}
        stamp = format_time(allocator.clock())
        requested = request.describe()
        if len(self.hosts) > 1:
            requested += f" on {','.join(self.hosts)}"
        entry = QueueEntry(
            job=request.job,
            host=self.hosts[0],
            holder=allocator.holder,
            since=stamp,
            gpus=request.gpus,
            count=request.count,
            slots=request.slots,
            priority=priority_of(
                policy,
                allocator.holder,
                allocator.holder_groups(policy),
                None if request.self_service else request.job,
            ),
            requested=requested,
            self_service=request.self_service,
            fair_share=share.factor if share else None,
            usage=share.usage if share else None,
            preemptible=request.preemptible,
        )
        ops = []
        for host, key in self.keys.items():
            ops.append(Put(key, replace_struct(entry, host=host).to_json(), lease=self.lease))
            ops.append(Put(layout.queue_arrivals(host), stamp.encode()))
        store.txn([], ops)
        self._thread = threading.Thread(target=self._keep_alive, daemon=True, name="queue-lease")
        self._thread.start()
        return dict(self.keys)

    def _keep_alive(self) -> None:
        lease, stop = self.lease, self._stop
        while lease is not None and not stop.wait(self.ttl / 3):
            try:
                self.allocator.store.refresh_lease(lease)
            except LeaseLost:
                self.lost = True
                return
            except AllocatorError:
                continue  # a store outage: try again; the lease outlives a short one

    def changes(self, timeout: float) -> None:
        """Return when something the turn depends on changed, or after ``timeout`` seconds.

        One watch on the store's root, filtered here: each host's keys and
        queue, and the quota counters (a backend's watch costs the same for
        one prefix as for several, and a short-lived waiter keeps one stream).
        """
        layout = self.allocator.layout
        prefixes = (
            *(layout.host(h) for h in self.hosts),
            *(layout.host_queue(h) for h in self.hosts),
            layout.holders,
            layout.policy,
        )
        end = time.monotonic() + timeout
        try:
            if self._watch is None:
                store = self.allocator.store
                start = store.list(layout.policy, limit=1).revision + 1
                self._watch = store.watch(f"{layout.root}/", start)
                self.maybe_removed = True  # so would a cancel: its tombstone is read once
                return  # a change before the watch began would go unseen: try once more
            while not self.lost and (left := end - time.monotonic()) > 0:
                events = self._watch.next(left)
                mine = self.keys.values()
                if any(e.type == "delete" and e.key in mine for e in events):
                    self.maybe_removed = True
                if any(e.key.startswith(prefixes) for e in events):
                    return
        except AllocatorError:  # a broken or compacted watch: start a new one next time
            self.maybe_removed = True  # a delete it missed would go unseen
            self._close_watches()
            time.sleep(max(0.0, min(end - time.monotonic(), 0.5)))

    def _close_watches(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def leave(self) -> None:
        """Remove every entry now (revoke their lease); no error if they are gone."""
        self._stop.set()
        self._close_watches()
        if self.lease is not None:
            lease, self.lease = self.lease, None
            with contextlib.suppress(AllocatorError):  # else the lease expires by itself
                self.allocator.store.revoke_lease(lease)
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
