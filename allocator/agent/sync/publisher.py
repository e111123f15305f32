"""Writes what the agent knows to the store: its leased record and its worker records.

An idle agent writes nothing: liveness is the lease's keep-alive alone (etcd
keeps every revision until compaction, so a record rewritten on every
heartbeat would fill a fleet's etcd), and a record is put only when what
the agent means to publish differs from what is stored. What is stored is
learned from the link's reads, so a record someone else changed or deleted
is put back, and a worker record of a job this agent no longer tracks
(left by an earlier run, or written by hand) is removed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from allocator.errors import LeaseLost
from allocator.records.keys import KeyLayout
from allocator.store import KeyValue, Store

__all__ = ["Publisher"]

Stored = tuple[bytes, int | None]


class Publisher:
    """One host's liveness lease, its ``agent`` key and its ``workers/<job>`` keys."""

    def __init__(
        self, layout: KeyLayout, host: str, log: Callable[[str, dict[str, Any]], None]
    ) -> None:
        self.agent_key = layout.agent(host)
        self.workers_prefix = layout.host_workers(host)
        self.layout = layout
        self.host = host
        self.log = log
        self.lease: int | None = None
        #: What the store holds at each of the agent's keys, as far as the agent knows.
        self.stored: dict[str, Stored] = {}
        self.writes = 0

    def observe(self, own: Mapping[str, KeyValue]) -> None:
        """Take what a read found at the agent's own keys as the truth to compare with."""
        self.stored = {key: (item.value, item.lease) for key, item in own.items()}

    def forget(self) -> None:
        """After losing the store: nothing stored is known until the next read."""
        self.stored = {}

    def keep_alive(self, store: Store, ttl: float) -> None:
        """Refresh the lease, or grant one when there is none or it was lost."""
        if self.lease is not None:
            try:
                store.refresh_lease(self.lease)
                return
            except LeaseLost:  # the store was away longer than the TTL: the record is gone
                self.log("lease-lost", {"lease": self.lease})
                self.lease_lost()
        self.lease = store.grant_lease(ttl)

    def lease_lost(self) -> None:
        """The lease is gone, and the record under it with it: both are made anew."""
        self.lease = None
        self.stored.pop(self.agent_key, None)

    def publish(
        self, store: Store, agent: bytes | None, workers: Mapping[str, bytes] | None
    ) -> int:
        """Put what differs from the store, delete stray worker records; return the writes.

        ``agent`` goes under the lease (call :meth:`keep_alive` first);
        ``workers`` is every worker record by job, or ``None`` while the
        agent does not know yet what it runs (then none is touched).
        """
        wanted: dict[str, Stored] = {}
        if agent is not None and self.lease is not None:
            wanted[self.agent_key] = (agent, self.lease)
        if workers is not None:
            for job, raw in workers.items():
                wanted[self.layout.workers(self.host, job)] = (raw, None)
        writes = 0
        for key, (value, lease) in sorted(wanted.items()):
            if self.stored.get(key) != (value, lease):
                store.put(key, value, lease=lease)
                self.stored[key] = (value, lease)
                writes += 1
        if workers is not None:
            stray = [
                k for k in self.stored if k.startswith(self.workers_prefix) and k not in wanted
            ]
            for key in sorted(stray):
                store.delete(key)
                del self.stored[key]
                writes += 1
        self.writes += writes
        return writes

    def withdraw(self, store: Store, *, keep_worker_records: bool) -> None:
        """On shutdown: drop the worker records (unless workers stay) and revoke the lease."""
        if not keep_worker_records:
            for key in sorted(k for k in self.stored if k.startswith(self.workers_prefix)):
                store.delete(key)
                del self.stored[key]
        if self.lease is not None:
            store.revoke_lease(self.lease)
            self.lease = None
            self.stored.pop(self.agent_key, None)
