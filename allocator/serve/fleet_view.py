"""The whole fleet as ``allocator serve`` answers it, kept host by host.

:class:`FleetView` holds one :class:`~allocator.serve.host_view.HostView`
per host. :meth:`FleetView.update` asks the mirror which hosts changed and
rebuilds those only (every host when the policy changed or the store was
read again); fleet-wide figures (agents by state, idle holders, GPUs by
state per pool) are kept as sums that each rebuilt host corrects by its
difference. A host whose status moves with time alone (a reservation
window, an idle job's idle time) is rebuilt at most every
:data:`TIMED_SECONDS` even without a change. Documents put together from
the parts are kept until the next change.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from allocator.serve.broken import BrokenSince
from allocator.serve.host_view import AGENT_STATES, HostView, host_view
from allocator.serve.mirror import FleetMirror
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.policy import Policy
    from allocator.status.join import GroupStatus, HostStatus
    from allocator.status.summary import PoolSummary

__all__ = ["TIMED_SECONDS", "FleetView", "Totals"]

#: How often a host whose status moves with time alone is rebuilt without a change.
TIMED_SECONDS = 30.0


class Totals:
    """Fleet-wide sums of the hosts' parts, corrected host by host."""

    def __init__(self) -> None:
        self.agents = dict.fromkeys(AGENT_STATES, 0)
        self.idle_holders = 0
        #: ``status --summary``'s rows (without queued requests), by pool.
        self.pools: dict[str | None, PoolSummary] = {}

    def add(self, view: HostView, sign: int) -> None:
        """Count ``view`` in (``sign`` 1) or out (-1)."""
        from allocator.status.summary import COUNTS, PoolSummary

        agent = view.status.agent
        self.agents[agent] = self.agents.get(agent, 0) + sign
        self.idle_holders += sign * view.idle_holders
        row = self.pools.get(view.pool)
        if row is None:
            row = self.pools[view.pool] = PoolSummary(view.pool)
        for name in COUNTS:
            setattr(row, name, getattr(row, name) + sign * getattr(view.summary, name))
        if not row.hosts:
            del self.pools[view.pool]


class FleetView:
    """Every host's view, as of :attr:`revision`; safe to share between threads."""

    def __init__(
        self,
        mirror: FleetMirror,
        on_bad: Callable[[str], None],
        *,
        timed_seconds: float = TIMED_SECONDS,
        on_host_built: Callable[[str], None] = lambda _host: None,
    ) -> None:
        self.mirror = mirror
        self._on_bad = on_bad
        self._timed_seconds = timed_seconds
        self._on_host_built = on_host_built
        #: Held while the view is rebuilt or read (an answer sees one state).
        self.lock = threading.RLock()
        self.views: dict[str, HostView] = {}
        self.totals = Totals()
        #: Since when each unhealthy GPU and down agent has been seen.
        self.broken = BrokenSince()
        self.revision = 0
        #: Bumped by every change of a view: what documents built from views are kept by.
        self.version = 0
        self.policy: Policy | None = None
        self.pools: dict[str, str] = {}  # each host's pool (hosts of none left out)
        self._pool_index: dict[str, int] = {}
        self._names: list[str] | None = None
        self._grouped: set[str] = set()  # hosts with a share of a job across hosts
        self._timed: set[str] = set()
        self._timed_at: float | None = None
        self._kept: dict[str, tuple[int, Any]] = {}
        #: Hosts rebuilt since :meth:`take_touched` (``None``: every host, the view was redone).
        self._touched: dict[str, None] | None = {}

    def update(self, now: datetime, clock: float) -> None:
        """Rebuild the hosts that changed (and timed ones due) at wall time ``now``."""
        with self.lock:
            revision = self.mirror.revision
            changed = self.mirror.take_changes()
            policy = self.mirror.policy(self.mirror.policy_item(), self._on_bad)
            whole = changed is None or policy is not self.policy
            if whole:
                self._set_policy(policy)
                changed = self.mirror.host_names() | set(policy.hosts if policy else ())
                changed |= set(self.views)
            assert changed is not None
            if self._timed_at is None or clock - self._timed_at >= self._timed_seconds:
                changed = changed | self._timed
                self._timed_at = clock
            with _collector_paused(whole):
                for host in changed:
                    self._rebuild(host, now)
            if whole:
                self._touched = None
                if self.broken.started is None and self.views:
                    self.broken.started = format_time(now)  # the first fleet read
            elif self._touched is not None:
                self._touched.update(dict.fromkeys(changed))
            if changed or revision != self.revision:
                self.version += 1
            self.revision = revision

    def _set_policy(self, policy: Policy | None) -> None:
        self.policy = policy
        from allocator.status.filters import pool_by_host

        self.pools = pool_by_host(policy)
        self._pool_index = {name: n for n, name in enumerate(self.pool_names())}

    def _rebuild(self, host: str, now: datetime) -> None:
        from allocator.placement.reservations import on_host
        from allocator.status.join import status_of_part

        policy = self.policy
        items = self.mirror.host_items(host)
        old = self.views.pop(host, None)
        if old is not None:
            self.totals.add(old, -1)
        declared = policy is not None and host in policy.hosts
        self._grouped.discard(host)
        self._timed.discard(host)
        if not items and not declared:
            self._names = None
            self.broken.forget(host)
            return
        self._on_host_built(host)
        status = status_of_part(policy, items, self.mirror.layout, now, (), host)[0]
        reserved = policy is not None and bool(on_host(policy, host))
        pool = self.pools.get(host)
        view = host_view(status, pool, self._pool_index.get(pool or "", -1), reserved)
        self.views[host] = view
        self.broken.note(status, format_time(now))
        self.totals.add(view, 1)
        if old is None:
            self._names = None
        if any(job.nodes for job in status.jobs):
            self._grouped.add(host)
        if view.timed:
            self._timed.add(host)

    def names(self) -> list[str]:
        """Every host, by name."""
        with self.lock:
            if self._names is None:
                self._names = sorted(self.views)
            return self._names

    def pool_names(self) -> list[str]:
        """The policy's pools, by name."""
        return sorted(self.policy.pools) if self.policy is not None else []

    def statuses(self, names: Iterable[str]) -> list[HostStatus]:
        """The status of each of ``names`` (every one a host of the view)."""
        views = self.views
        return [views[name].status for name in names]

    def groups(self) -> list[GroupStatus]:
        """Every job across hosts (joined from the hosts that hold a share, and their nodes)."""
        from allocator.status.join import group_status

        with self.lock:
            views = self.views
            nodes = {n for h in self._grouped for job in views[h].status.jobs for n in job.nodes}
            return group_status(self.statuses(sorted((self._grouped | nodes) & set(views))))

    def take_touched(self) -> list[str] | None:
        """The hosts rebuilt since the last call, by name (``None``: every host was)."""
        with self.lock:
            touched, self._touched = self._touched, {}
            return sorted(touched) if touched is not None else None

    def kept(self, what: str, build: Callable[[], Any]) -> Any:
        """``build()``, built once per :attr:`version` (a document of the whole fleet)."""
        with self.lock:
            found = self._kept.get(what)
            if found is not None and found[0] == self.version:
                return found[1]
            value = build()
            self._kept[what] = (self.version, value)
            return value


@contextlib.contextmanager
def _collector_paused(whole: bool) -> Iterator[None]:
    """While every host is rebuilt: no cyclic collection, and what is kept frozen after.

    A fleet's views are a million objects that live until their host
    changes; the collector would walk them on every full collection, a
    one-host change's worth of work many times over (``allocator status``
    turns it off for the same reason).
    """
    if not whole or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    gc.collect()
    gc.freeze()
