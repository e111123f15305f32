"""The fleet's JSON and Prometheus answers of ``allocator serve``, put together from host parts.

Each function takes a :class:`~allocator.serve.fleet_view.FleetView`
brought up to date and returns bytes: the hosts' parts were written when
the hosts changed, so an answer is mostly a join. Whole-fleet answers are
kept until the next change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from allocator.errors import InvalidInput, NotFound
from allocator.serve.fleet_view import FleetView
from allocator.serve.host_view import CELL_STATES, metric_value

if TYPE_CHECKING:
    from allocator.serve.select import Selection
    from allocator.status.join import GroupStatus, HostStatus

__all__ = [
    "DEFAULT_PER_PAGE",
    "MAX_PER_PAGE",
    "StatusQuery",
    "fleet_json",
    "host_json",
    "metrics_text",
    "parse_status_query",
    "status_json",
]

DEFAULT_PER_PAGE = 100
MAX_PER_PAGE = 1000
#: The filters ``/api/v1/status`` takes, as ``allocator status`` does.
FILTERS = ("host", "pool", "job", "state")
_PAGING = ("page", "per_page")


@dataclass(frozen=True, slots=True)
class StatusQuery:
    """What ``/api/v1/status`` was asked: filters, and which page (``None``: the whole fleet)."""

    filters: Mapping[str, str]
    page: int | None = None
    per_page: int = DEFAULT_PER_PAGE


def parse_status_query(query: Mapping[str, str]) -> StatusQuery:
    """The query of ``/api/v1/status``; :class:`InvalidInput` (one line) when it is wrong."""
    unknown = sorted(set(query) - {*FILTERS, *_PAGING})
    if unknown:
        raise InvalidInput(
            f"{unknown[0]}: not a parameter of /api/v1/status "
            f"(expected {', '.join((*FILTERS, *_PAGING))})"
        )
    filters = {name: query[name] for name in FILTERS if name in query}
    if not filters and not any(name in query for name in _PAGING):
        return StatusQuery({})
    page = _whole(query, "page", 1, 1, None)
    per_page = _whole(query, "per_page", DEFAULT_PER_PAGE, 1, MAX_PER_PAGE)
    return StatusQuery(filters, page, per_page)


def _whole(query: Mapping[str, str], name: str, default: int, least: int, most: int | None) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or int(raw) < least or (most and int(raw) > most):
        upper = f" to {most}" if most else " or more"
        raise InvalidInput(f"{name}={raw!r}: expected a whole number {least}{upper}")
    return int(raw)


#: The hosts a query's filters select (:func:`allocator.serve.select.select_hosts`).
Select = Callable[[FleetView, Mapping[str, str]], "Selection"]


#: Hosts per piece of the whole fleet's status document (some 1.5 MB each at 8 GPUs).
HOSTS_PER_PIECE = 400


def status_json(view: FleetView, query: StatusQuery, select: Select) -> bytes | Iterator[bytes]:
    """``status -o json`` of the fleet, or of one page of the hosts ``query`` selects.

    The whole fleet's document (tens of megabytes at 12,500 hosts) comes in
    pieces, joined as they are sent from the hosts' parts as they are now:
    never whole in memory.
    """
    if query.page is None:
        return _pieces(view)
    if query.filters:
        chosen = select(view, query.filters)
        names, show = chosen.names, chosen.show
    else:
        names, show = view.names(), _unpicked
    pages = -(-len(names) // query.per_page)
    if query.page > max(pages, 1):
        raise InvalidInput(f"page={query.page}: there are {pages} pages of {query.per_page}")
    start = (query.page - 1) * query.per_page
    paging = {
        "number": query.page,
        "per_page": query.per_page,
        "hosts": len(names),
        "pages": pages,
    }
    shown = show(names[start : start + query.per_page])
    return _status(view, shown, paging, _groups_shown(query.filters))


def _unpicked(names: Sequence[str]) -> list[tuple[str, HostStatus | None]]:
    return [(name, None) for name in names]


def _groups_shown(filters: Mapping[str, str]) -> Callable[[GroupStatus], bool] | None:
    """Which jobs across hosts a filtered page lists, as ``allocator status`` does.

    None under ``host=``, ``pool=`` or ``state=`` (their other shares may be
    left out or trimmed away: unknown, not missing); under ``job=`` those
    jobs, whole; without a filter, every one.
    """
    if not filters:
        return None
    from allocator.status.filters import parse_filter

    wanted = parse_filter(filters)
    if wanted.hosts or wanted.pools or wanted.states:
        return lambda _group: False
    return lambda group: group.job in wanted.jobs


def _status(
    view: FleetView,
    hosts: Sequence[tuple[str, HostStatus | None]],
    paging: dict[str, int] | None,
    shown: Callable[[GroupStatus], bool] | None = None,
) -> bytes:
    import msgspec

    from allocator.status.documents import status_host_document

    groups = [g.to_dict() for g in view.groups() if shown is None or shown(g)]
    views = view.views
    tail: dict[str, Any] = {"jobs_across_hosts": groups, "revision": view.revision}
    if paging is not None:
        tail["page"] = paging
    return b"".join(
        (
            b'{"hosts":[',
            b",".join(
                views[name].json
                if picked is None
                else msgspec.json.encode(status_host_document(picked))
                for name, picked in hosts
            ),
            b"],",
            msgspec.json.encode(tail)[1:],
        )
    )


def _pieces(view: FleetView) -> Iterator[bytes]:
    parts = [view.views[name].json for name in view.names()]
    head, tail = _status(view, (), None).split(b"[]", 1)

    def pieces() -> Iterator[bytes]:
        yield head + b"["
        for start in range(0, len(parts), HOSTS_PER_PIECE):
            comma = b"," if start else b""
            yield comma + b",".join(parts[start : start + HOSTS_PER_PIECE])
        yield b"]" + tail

    return pieces()


def host_json(view: FleetView, host: str) -> bytes:
    """``status -o json host=H``; :class:`NotFound` for a host the fleet does not have."""
    import msgspec

    found = view.views.get(host)
    if found is None:
        raise NotFound(f"host {host!r}: no such host (not in the policy, no keys)")
    tail = msgspec.json.encode({"jobs_across_hosts": [], "revision": view.revision})
    return b'{"hosts":[' + found.json + b"]," + tail[1:]


def fleet_json(view: FleetView, generated_at: str) -> bytes:
    """The whole fleet's grid: one row per host, one character per GPU (see the docs)."""
    import msgspec

    def build() -> bytes:
        head = {
            "revision": view.revision,
            "generated_at": generated_at,
            "states": CELL_STATES,
            "pools": view.pool_names(),
        }
        views = view.views
        rows = b",".join(views[name].grid_row for name in view.names())
        return msgspec.json.encode(head)[:-1] + b',"hosts":[' + rows + b"]}"

    return bytes(view.kept("fleet", build))


_HOST_FAMILIES = (
    ("allocator_fleet_gpus", "GPUs per host by state, as the store says."),
    (
        "allocator_fleet_job_idle_seconds",
        "How long each idle job's GPUs have been idle, as its agent says.",
    ),
    ("allocator_fleet_unassigned_processes", "Processes on a GPU that no job there was given."),
)


def metrics_text(view: FleetView, store_up: bool, unreachable_seconds: float) -> bytes:
    """The fleet's Prometheus exposition: the hosts' lines joined, the sums kept."""

    def hosts_part() -> list[bytes]:
        views = view.views
        names = view.names()
        return [b"".join(views[name].metric_lines[n] for name in names) for n in range(3)]

    gpus, idle, strays = view.kept("metrics", hosts_part)
    totals = view.totals
    agents = "".join(
        f'allocator_fleet_agents{{state="{state}"}} {metric_value(float(n))}\n'
        for state, n in totals.agents.items()
    )

    def one(name: str, text: str, value: float) -> bytes:
        return _head(name, text) + f"{name} {metric_value(value)}\n".encode()

    return b"".join(
        (
            _head(*_HOST_FAMILIES[0]),
            gpus,
            _head("allocator_fleet_agents", "Host agents by liveness."),
            agents.encode(),
            _head(*_HOST_FAMILIES[1]),
            idle,
            one(
                "allocator_fleet_idle_holders",
                "Jobs idle past their policy's idle rule.",
                float(totals.idle_holders),
            ),
            _head(*_HOST_FAMILIES[2]),
            strays,
            one(
                "allocator_store_up",
                "1 while allocator serve reaches the store.",
                1.0 if store_up else 0.0,
            ),
            one(
                "allocator_store_unreachable_seconds",
                "Seconds since allocator serve last reached the store (0 while it does).",
                0.0 if store_up else unreachable_seconds,
            ),
        )
    )


def _head(name: str, text: str) -> bytes:
    return f"# HELP {name} {text}\n# TYPE {name} gauge\n".encode()
