"""What is broken in the fleet: unhealthy GPUs and agents down, each with since when.

The store keeps no time for either (an agent's record changes only when its
content does, and an agent that is gone has no record), so serve notes when
it first saw each one: :class:`BrokenSince` is told every rebuilt host's
status (:mod:`allocator.serve.fleet_view`) and keeps, per host, the first
time each of its GPUs was seen unhealthy and its agent seen down. What was
broken when serve read the store is "since" that read (the document says
``since_serve_started`` for those).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from allocator.status.join import HostStatus

__all__ = ["AGENT_REASONS", "BrokenSince", "broken_json"]

#: The agent states listed (all but ``alive``), and what the list says of each. The
#: first two are the summary's ``agents_down``.
AGENT_REASONS = {
    "gone": "agent gone (no lease; its workers' records remain)",
    "none": "no agent (none has reported, or its key is gone with nothing left)",
    "unleased": "agent record without a lease",
    "stale": "agent cannot read its assignments (working from an old view)",
}
_UNHEALTHY = "unhealthy: "


@dataclass(slots=True)
class _HostBroken:
    """One host's broken parts: GPU -> (reason, since), and its agent's (state, since)."""

    gpus: dict[str, tuple[str, str]] = field(default_factory=dict)
    agent: tuple[str, str] | None = None


class BrokenSince:
    """Since when each unhealthy GPU and down agent has been seen (not thread-safe alone:
    the fleet view's lock covers it)."""

    def __init__(self) -> None:
        self.hosts: dict[str, _HostBroken] = {}
        #: When the first whole fleet was noted: what was broken then is "since" this.
        self.started: str | None = None

    def note(self, status: HostStatus, at: str) -> None:
        """``status`` was built at ``at`` (a formatted time): keep the first sighting of each."""
        old = self.hosts.get(status.host, _HostBroken())
        new = _HostBroken()
        for row in status.gpus:
            if row.health.startswith(_UNHEALTHY):
                reason = row.health.removeprefix(_UNHEALTHY)
                seen = old.gpus.get(row.gpu)
                new.gpus[row.gpu] = (reason, seen[1] if seen else at)
        if status.agent in AGENT_REASONS:
            same = old.agent is not None and old.agent[0] == status.agent
            new.agent = (status.agent, old.agent[1] if same and old.agent else at)
        if new.gpus or new.agent:
            self.hosts[status.host] = new
        else:
            self.hosts.pop(status.host, None)

    def forget(self, host: str) -> None:
        """``host`` left the fleet."""
        self.hosts.pop(host, None)


def broken_json(broken: BrokenSince, pools: dict[str, str], limit: int) -> dict[str, Any]:
    """The unhealthy GPUs and down agents, longest broken first, ``limit`` of each.

    ``gpus_total``/``agents_total`` say how many there are in all.
    """
    gpus = sorted(
        (since, host, gpu, reason)
        for host, part in broken.hosts.items()
        for gpu, (reason, since) in part.gpus.items()
    )
    agents = sorted(
        (part.agent[1], host, part.agent[0])
        for host, part in broken.hosts.items()
        if part.agent is not None
    )
    return {
        "gpus": [
            {"host": h, "pool": pools.get(h), "gpu": g, "reason": r, "since": s}
            for s, h, g, r in gpus[:limit]
        ],
        "gpus_total": len(gpus),
        "agents": [
            {"host": h, "pool": pools.get(h), "state": a, "reason": AGENT_REASONS[a], "since": s}
            for s, h, a in agents[:limit]
        ],
        "agents_total": len(agents),
        "since_serve_started": broken.started,
    }
