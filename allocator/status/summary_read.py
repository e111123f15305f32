"""``status --summary`` of a fleet from the counts agents write, not from every host's records.

Each agent keeps ``counts/<host>`` (:mod:`allocator.records.host_counts`)
current under its lease. The summary reads that one small prefix, and the
records of only the hosts it does not cover (no live agent, an agent of an
older version or one refused the key, a damaged record): read in key ranges
at the policy's revision like any filtered status. At 12,500 hosts that is
12,500 keys instead of 175,000.

What it cannot see: a host outside the policy, with records but no agent
(its agent's counts would name it): the whole ``status`` lists it. Without
an applied policy, or with no counts written at all, every host's records
are read, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from allocator.errors import PermissionDenied
from allocator.records.keys import KeyLayout
from allocator.status.source import StatusSource
from allocator.status.summary_count import HostCount, reported_counts

if TYPE_CHECKING:
    from allocator.policy.model import Policy

__all__ = ["CountsPicker"]


class CountsPicker:
    """Picks the hosts a summary must read: those the agents' counts do not cover.

    Called by :func:`allocator.status.read.read_status` with the policy
    (as its ``pick``); :attr:`reported` then holds the hosts counted from
    their agents' records, to add to the rows read.
    """

    def __init__(
        self,
        allocator: StatusSource,
        now: datetime,
        pools_of: Callable[[Policy], dict[str, str]],
        narrow: Callable[[Policy | None], Sequence[str] | None] | None = None,
    ) -> None:
        self._allocator = allocator
        self._now = now
        self._pools_of = pools_of
        self._narrow = narrow
        self.reported: list[HostCount] = []

    def __call__(self, policy: Policy | None) -> list[str] | None:
        """The hosts to read (sorted), or ``None``: every host's records."""
        wanted = self._narrow(policy) if self._narrow is not None else None
        if policy is None:
            return None if wanted is None else list(wanted)
        layout: KeyLayout = self._allocator.layout
        try:
            listing = self._allocator.store.list(layout.counts)
        except PermissionDenied:  # a role granted before the counts: read the records
            return None if wanted is None else list(wanted)
        pools = self._pools_of(policy)
        found = reported_counts(
            policy, listing.items, layout, self._now, pools, self._allocator.on_bad_record
        )
        if not found:
            return None if wanted is None else list(wanted)
        candidates: Iterable[str] = wanted if wanted is not None else policy.hosts
        chosen = set(candidates) if wanted is not None else None
        self.reported = [c for h, c in sorted(found.items()) if chosen is None or h in chosen]
        return sorted(h for h in candidates if h not in found)
