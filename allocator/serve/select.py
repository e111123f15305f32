"""Which hosts a ``/api/v1/status`` query selects, and the fleet's summary.

The filters are ``allocator status``'s own; this module only applies them
to the hosts the view keeps.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.errors import InvalidInput
from allocator.serve.fleet_view import FleetView
from allocator.serve.host_view import CELL_STATES

__all__ = ["select_hosts", "summary_json"]


def select_hosts(view: FleetView, filters: Mapping[str, str]) -> list[str]:
    """The names of the hosts ``filters`` select, in order."""
    import fnmatch

    state = filters.get("state")
    if state is not None and state not in CELL_STATES:
        raise InvalidInput(f"state={state!r}: expected one of {', '.join(CELL_STATES)}")
    digit = str(CELL_STATES.index(state)) if state is not None else None
    pattern, pool, job = filters.get("host"), filters.get("pool"), filters.get("job")
    chosen = []
    for name in view.names():
        host = view.views[name]
        if pattern is not None and not fnmatch.fnmatchcase(name, pattern):
            continue
        if pool is not None and host.pool != pool:
            continue
        if job is not None and all(row.job != job for row in host.status.jobs):
            continue
        if digit is not None and digit not in host.cells:
            continue
        chosen.append(name)
    return chosen


def summary_json(view: FleetView) -> bytes:
    """The fleet's GPUs by state, per pool and in all."""
    import msgspec

    def build() -> bytes:
        totals = view.totals
        pools = {pool or "": dict(c) for pool, c in totals.pools.items()}
        return msgspec.json.encode({"pools": pools, "total": totals.total()})

    return bytes(view.kept("summary", build))
