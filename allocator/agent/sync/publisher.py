"""Writes what the agent knows to the store: its leased records and its worker records.

An idle agent writes nothing: liveness is the lease's keep-alive alone (etcd
keeps every revision until compaction, so a record rewritten on every
heartbeat would fill a fleet's etcd), and a record is put only when what
the agent means to publish differs from what is stored. What is stored is
learned from the link's reads, so a record someone else changed or deleted
is put back, and a worker record of a job this agent no longer tracks
(left by an earlier run, or written by hand) is removed.

The host's GPU counts (``counts/<host>``, for ``status --summary``) go
under the same lease but outside the host's prefix, so a read of the host
does not show them: what was put is remembered across reads, and forgotten
with the connection or the lease. A role that may not write them costs the
summary its shortcut, never the agent its link: the refusal is logged and
the counts are left alone until the next connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from allocator.errors import LeaseLost, PermissionDenied
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
        self.counts_key = layout.host_counts(host)
        self.counts_refused = False
        self.workers_prefix = layout.host_workers(host)
        self.layout = layout
        self.host = host
        self.log = log
        self.lease: int | None = None
        self.granted_ttl = 0.0  # the TTL the lease was granted with
        #: What the store holds at each of the agent's keys, as far as the agent knows.
        self.stored: dict[str, Stored] = {}
        self.writes = 0

    def observe(self, own: Mapping[str, KeyValue]) -> None:
        """Take what a read found at the agent's own keys as the truth to compare with."""
        counts = self.stored.get(self.counts_key)  # not under the host's prefix: not read
        self.stored = {key: (item.value, item.lease) for key, item in own.items()}
        if counts is not None:
            self.stored[self.counts_key] = counts

    def forget(self) -> None:
        """After losing the store: nothing stored is known until the next read."""
        self.stored = {}
        self.counts_refused = False

    def keep_alive(self, store: Store, ttl: float) -> None:
        """Refresh the lease, or grant one when there is none, it was lost or is too short.

        A lease shorter than ``ttl`` (granted before the agent learnt the
        fleet's size) is replaced: the next :meth:`publish` puts the records
        under the new one, and the old one, holding nothing then, expires.
        """
        if self.lease is not None and ttl > self.granted_ttl:
            self.log("lease-lengthened", {"lease": self.lease, "ttl": ttl})
            self.lease = None
        elif self.lease is not None:
            try:
                store.refresh_lease(self.lease)
                return
            except LeaseLost:  # the store was away longer than the TTL: the record is gone
                self.log("lease-lost", {"lease": self.lease})
                self.lease_lost()
        self.lease = store.grant_lease(ttl)
        self.granted_ttl = ttl

    def lease_lost(self) -> None:
        """The lease is gone, and the record under it with it: both are made anew."""
        self.lease = None
        self.stored.pop(self.agent_key, None)
        self.stored.pop(self.counts_key, None)

    def publish(
        self,
        store: Store,
        agent: bytes | None,
        workers: Mapping[str, bytes] | None,
        counts: bytes | None = None,
    ) -> int:
        """Put what differs from the store, delete stray worker records; return the writes.

        ``agent`` goes under the lease (call :meth:`keep_alive` first);
        ``workers`` is every worker record by job, or ``None`` while the
        agent does not know yet what it runs (then none is touched, nor
        the counts). ``counts``: the host's GPU counts, under the lease
        (``None``: none are kept, as for a host without GPUs found).
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
            writes += self._publish_counts(store, counts)
            stray = [
                k for k in self.stored if k.startswith(self.workers_prefix) and k not in wanted
            ]
            for key in sorted(stray):
                store.delete(key)
                del self.stored[key]
                writes += 1
        self.writes += writes
        return writes

    def _publish_counts(self, store: Store, counts: bytes | None) -> int:
        """Put (or drop) the host's counts when they differ from what was put; the writes."""
        if self.counts_refused or self.lease is None:
            return 0
        stored = self.stored.get(self.counts_key)
        try:
            if counts is not None and stored != (counts, self.lease):
                store.put(self.counts_key, counts, lease=self.lease)
                self.stored[self.counts_key] = (counts, self.lease)
                return 1
            if counts is None and stored is not None:
                store.delete(self.counts_key)
                del self.stored[self.counts_key]
                return 1
        except PermissionDenied as exc:
            self.counts_refused = True
            self.log(
                "counts-refused",
                {
                    "key": self.counts_key,
                    "error": " ".join(str(exc).split()),
                    "hint": "grant this agent write access to its counts key; "
                    "status --summary reads the host's records meanwhile",
                },
            )
        return 0

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
            self.stored.pop(self.counts_key, None)
