"""Which hosts a ``/api/v1/status`` query selects, and the fleet's summary, from the view.

The filters and the summary are ``allocator status``'s own
(:mod:`allocator.status.filters`, :mod:`allocator.status.summary`); this
module applies them to the hosts the view keeps. Which hosts match is told
from what each host's view keeps (its name, pool, jobs and the states of
its rows); only the hosts of the page shown get their rows picked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from allocator.serve.fleet_view import FleetView
from allocator.status.join import HostStatus

__all__ = ["Selected", "Selection", "select_hosts", "summary_json"]

#: A host shown: its name, and its status with only the rows picked (``None``: whole).
Selected = tuple[str, HostStatus | None]


@dataclass(frozen=True, slots=True)
class Selection:
    """The hosts a query matches, by name, and how to show some of them."""

    names: list[str]
    show: Callable[[Sequence[str]], list[Selected]]


def select_hosts(view: FleetView, filters: Mapping[str, str]) -> Selection:
    """The hosts ``filters`` select; ``InvalidInput`` (one line) for a filter that does not read.

    Under ``job=``/``state=`` a host is shown with only the rows they pick.
    """
    from allocator.status.filters import filter_hosts, host_matcher, parse_filter

    wanted = parse_filter(filters)
    names = view.names()
    views = view.views
    if wanted.hosts:
        matches = host_matcher(wanted.hosts)
        names = [name for name in names if matches(name)]
    if wanted.pools:
        names = [name for name in names if view.pools.get(name) in wanted.pools]
    if wanted.states:  # a host some row of which is in one of the states
        states = set(wanted.states)
        names = [name for name in names if views[name].states & states]
    if wanted.jobs:  # a host the job holds a row of: every job holds one
        jobs = set(wanted.jobs)
        names = [name for name in names if any(j.job in jobs for j in views[name].status.jobs)]
    if wanted.jobs and wanted.states:  # the same row both: picked for real
        names = [host.host for host in filter_hosts(view.statuses(names), wanted, view.pools)]

    def show(shown: Sequence[str]) -> list[Selected]:
        if not wanted.trims_rows:
            return [(name, None) for name in shown]
        return [
            (host.host, host) for host in filter_hosts(view.statuses(shown), wanted, view.pools)
        ]

    return Selection(names, show)


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
