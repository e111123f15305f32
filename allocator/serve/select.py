"""Which hosts a ``/api/v1/status`` query selects, and the fleet's summary, from the view.

The filters and the summary are ``allocator status``'s own
(:mod:`allocator.status.filters`, :mod:`allocator.status.summary`); this
module applies them to the hosts the view keeps.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.serve.fleet_view import FleetView
from allocator.status.join import HostStatus

__all__ = ["Selected", "select_hosts", "summary_json"]

#: A host selected: its name, and its status with only the rows picked (``None``: whole).
Selected = tuple[str, HostStatus | None]


def select_hosts(
    view: FleetView, filters: Mapping[str, str]
) -> list[tuple[str, HostStatus | None]]:
    """The hosts ``filters`` select, by name: each with its rows picked by ``job=``/``state=``
    (``None``: the host whole). ``InvalidInput`` (one line) for a filter that does not read."""
    from allocator.status.filters import filter_hosts, host_matcher, parse_filter

    wanted = parse_filter(filters)
    names = view.names()
    if wanted.hosts:
        matches = host_matcher(wanted.hosts)
        names = [name for name in names if matches(name)]
    if wanted.pools:
        names = [name for name in names if view.pools.get(name) in wanted.pools]
    if not wanted.trims_rows:
        return [(name, None) for name in names]
    trimmed = filter_hosts(view.statuses(names), wanted, view.pools)
    return [(host.host, host) for host in trimmed]


def summary_json(view: FleetView) -> bytes:
    """``status --summary -o json`` of the fleet: its pools' rows, kept host by host."""
    import msgspec

    from allocator.records.keys import split_host_key
    from allocator.status.summary import add_up, summary_document

    def build() -> bytes:
        rows = {pool: msgspec.structs.replace(row) for pool, row in view.totals.pools.items()}
        for key in view.mirror.queued_keys():
            parsed = split_host_key(key, view.mirror.layout.queue)
            host = parsed[0] if parsed is not None else ""
            if host in view.views:
                rows[view.pools.get(host)].queued += 1
        return msgspec.json.encode(summary_document(add_up(rows.values(), view.revision)))

    return bytes(view.kept("summary", build))
