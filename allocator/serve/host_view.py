"""One host as ``allocator serve`` keeps it: everything its answers need, built once (pure).

A host's :class:`HostView` is built when the host's keys change (or the
policy does), never per request: its ``status -o json`` part as bytes, its
cells on the fleet grid, its ``status --summary`` counts, and its lines of
the fleet's Prometheus series. Fleet-wide answers are put together from these parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from allocator.status.filters import gpu_states, holders_of, row_holders
from allocator.status.join import GpuRow, HostStatus
from allocator.status.summary import PoolSummary

__all__ = [
    "AGENT_STATES",
    "CELL_STATES",
    "GRID_AGENTS",
    "HostView",
    "cell_state",
    "host_view",
    "metric_value",
]

#: Every agent state ``status`` knows (each gets a series, zero or not).
AGENT_STATES = ("alive", "stale", "unleased", "gone", "none")
#: The states a GPU's cell on the fleet grid can have; a cell is its index here.
CELL_STATES = ("free", "held", "idle", "unhealthy", "fallback", "unassigned", "reserved", "unknown")
#: The agent as the grid shows it: ``up`` (its key lives), ``down`` (gone), ``none``.
GRID_AGENTS = {"alive": "up", "stale": "up", "unleased": "up", "gone": "down", "none": "none"}
_CELL_DIGIT = {state: str(n) for n, state in enumerate(CELL_STATES)}


@dataclass(frozen=True, slots=True)
class HostView:
    """One host, ready to answer with: see the module doc."""

    status: HostStatus
    #: The host's item of ``status -o json``'s ``hosts`` (compact JSON).
    json: bytes
    pool: str | None
    #: One character per GPU: its index in :data:`CELL_STATES`.
    cells: str
    #: Every state (``status state=``) some row of the host is in.
    states: frozenset[str]
    #: The host's row of the fleet grid (``["node1", 0, "up", "0110"]``), as JSON.
    grid_row: bytes
    #: The host's counts as ``status --summary`` makes them (queued requests aside).
    summary: PoolSummary
    #: The host's samples of ``allocator_fleet_gpus``, ``_job_idle_seconds`` and
    #: ``_unassigned_processes``, in the exposition format.
    metric_lines: tuple[bytes, bytes, bytes]
    idle_holders: int
    #: Whether the host's status moves with time alone (a reservation, an idle job).
    timed: bool

    @property
    def name(self) -> str:
        """The host's name."""
        return self.status.host


def host_view(status: HostStatus, pool: str | None, pool_index: int, reserved: bool) -> HostView:
    """The view of one host's status.

    ``pool_index``: its pool's place among the policy's pools (-1: none);
    ``reserved``: the policy reserves GPUs of it.
    """
    import msgspec

    from allocator.status.documents import status_host_document
    from allocator.status.summary import summarize

    by_gpu = row_holders(status)
    states = [gpu_states(row, holders_of(row, by_gpu)) for row in status.gpus]
    cells = "".join(
        cell_state(row, status.agent, row_states)
        for row, row_states in zip(status.gpus, states, strict=True)
        if row.gpu != "cpu"
    )
    pools = {status.host: pool} if pool is not None else {}
    return HostView(
        status=status,
        json=msgspec.json.encode(status_host_document(status)),
        pool=pool,
        cells=cells,
        states=frozenset().union(*states),
        grid_row=msgspec.json.encode((status.host, pool_index, GRID_AGENTS[status.agent], cells)),
        summary=summarize([status], pools).total,
        metric_lines=_metric_lines(status),
        idle_holders=sum(job.idle_holder for job in status.jobs),
        timed=reserved or any(job.idle_since is not None for job in status.jobs),
    )


def cell_state(row: GpuRow, agent: str, states: frozenset[str]) -> str:
    """The grid's digit for one GPU whose ``status state=`` states are ``states``.

    The first of unhealthy, fallback, idle, held
    (:func:`~allocator.status.filters.gpu_states`); a GPU nobody holds is
    unassigned (processes nobody was given), reserved, unknown (its agent is
    gone) or free.
    """
    for state in ("unhealthy", "fallback", "idle", "held"):
        if state in states:
            return _CELL_DIGIT[state]
    if row.unassigned:
        return _CELL_DIGIT["unassigned"]
    if row.reserved:
        return _CELL_DIGIT["reserved"]
    # The agent died with workers left: what runs on its GPUs is not known.
    return _CELL_DIGIT["unknown" if agent == "gone" else "free"]


def metric_value(value: float) -> str:
    """A sample's value as the Prometheus client library writes it (``1.0``, ``+Inf``)."""
    from prometheus_client.utils import floatToGoString

    write = cast(Callable[[float], str], floatToGoString)
    return write(value)


def _metric_lines(status: HostStatus) -> tuple[bytes, bytes, bytes]:
    host = _label(status.host)
    counts = {"assigned": 0, "free": 0, "unhealthy": 0}
    strays = []
    for row in status.gpus:
        if row.gpu == "cpu":
            continue
        held = row.holder is not None
        counts["unhealthy" if row.health != "ok" else "assigned" if held else "free"] += 1
        if row.unassigned:
            strays.append(
                f'allocator_fleet_unassigned_processes{{host="{host}",gpu="{_label(row.gpu)}"}} '
                f"{metric_value(float(len(row.unassigned)))}\n"
            )
    gpus = "".join(
        f'allocator_fleet_gpus{{host="{host}",state="{state}"}} {metric_value(float(n))}\n'
        for state, n in counts.items()
    )
    idle = "".join(
        f'allocator_fleet_job_idle_seconds{{host="{host}",job="{_label(job.job)}"}} '
        f"{metric_value(job.idle_seconds)}\n"
        for job in status.jobs
        if job.idle_seconds is not None
    )
    return gpus.encode(), idle.encode(), "".join(strays).encode()


def _label(value: str) -> str:
    """A label value escaped as the exposition format wants it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
