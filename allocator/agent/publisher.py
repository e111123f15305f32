"""Writes what the agent knows to the store: its leased record and its worker records.

Worker records are written only when they change, so an idle agent costs the
store one lease refresh and one small put per heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from allocator.errors import LeaseLost
from allocator.keys import KeyLayout
from allocator.store import Store

__all__ = ["Publisher"]


class Publisher:
    """One host's liveness lease and ``workers/<job>`` keys."""

    def __init__(
        self, layout: KeyLayout, host: str, log: Callable[[str, dict[str, Any]], None]
    ) -> None:
        self.layout = layout
        self.host = host
        self.log = log
        self.lease: int | None = None
        self.published: dict[str, bytes] = {}

    def heartbeat(self, store: Store, record: bytes, ttl: float) -> None:
        """Refresh (or re-grant) the lease and put the agent record under it."""
        if self.lease is not None:
            try:
                store.refresh_lease(self.lease)
            except LeaseLost:  # the store was away longer than the TTL
                self.log("lease-lost", {"lease": self.lease})
                self.lease = None
        if self.lease is None:
            self.lease = store.grant_lease(ttl)
        store.put(self.layout.agent(self.host), record, lease=self.lease)

    def workers(self, store: Store, records: Mapping[str, bytes]) -> None:
        """Put changed worker records; delete those of jobs no longer tracked."""
        for job, raw in records.items():
            if self.published.get(job) != raw:
                store.put(self.layout.workers(self.host, job), raw)
                self.published[job] = raw
        for job in set(self.published) - set(records):
            store.delete(self.layout.workers(self.host, job))
            del self.published[job]

    def withdraw(self, store: Store, *, keep_worker_records: bool) -> None:
        """On shutdown: drop the worker records (unless workers stay) and revoke the lease."""
        if not keep_worker_records:
            for job in list(self.published):
                store.delete(self.layout.workers(self.host, job))
            self.published.clear()
        if self.lease is not None:
            store.revoke_lease(self.lease)
            self.lease = None
