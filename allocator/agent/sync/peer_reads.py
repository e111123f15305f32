"""Reading the other hosts of this host's jobs across hosts: one prefix read each.

A host the agent may not read is logged once (until it can be read again)
and left unknown (``readable=False``), never stale: its share of the job is
simply not known here (see :mod:`allocator.agent.planning.across_hosts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocator.agent.planning.across_hosts import PeerHost, peer_from_listing, peer_jobs
from allocator.agent.sync.host_records import HostView
from allocator.errors import BadRecord, PermissionDenied
from allocator.records.keys import KeyLayout
from allocator.store import Store

__all__ = ["read_peers"]


def read_peers(
    store: Store,
    layout: KeyLayout,
    view: HostView,
    own_host: str,
    refused: set[str],
    log: Callable[[str, dict[str, Any]], None],
) -> tuple[dict[str, PeerHost], list[tuple[BadRecord, int]]]:
    """Each peer host's state and the bad records found; ``refused`` remembers who was logged."""
    peers: dict[str, PeerHost] = {}
    bad: list[tuple[BadRecord, int]] = []
    for host, jobs in peer_jobs(view.assignments, own_host).items():
        try:
            listing = store.list(layout.host(host))
        except PermissionDenied as exc:
            if host not in refused:
                refused.add(host)
                log("peer-unreadable", {"peer": host, "jobs": list(jobs), "error": str(exc)})
            peers[host] = PeerHost(host, readable=False)
            continue
        refused.discard(host)
        peers[host], found = peer_from_listing(listing.items, layout, host, jobs)
        bad += found
    return peers, bad
