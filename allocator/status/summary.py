"""``status --summary``: one row of totals per pool, like ``sinfo`` (pure).

:func:`summarize` counts what the joined status of a read holds (the
:class:`~allocator.status.join.HostStatus` of each host), per pool, with a
total row; :func:`summary_document` is its JSON/YAML form (``status
--summary -o json``, and the web API's summary), :func:`summary_table` its
text. A row counts:

* ``hosts``; ``gpus`` (every GPU row, not the ``cpu`` rows of jobs on CPU);
* per GPU state (:mod:`allocator.status.filters`): ``free``, ``held``,
  ``idle``, ``unhealthy``, ``fallback`` (GPUs held by a job that runs on
  CPU by its fallback rule, and the jobs the fallback put on CPU);
* ``reserved``: GPUs inside a reservation window in force;
* ``queued``: requests waiting for the pool's hosts (:func:`queued_by_host`:
  a queue key whose record is not a request waits for nothing and is not
  counted);
* ``agents_down``: hosts whose agent is ``gone`` or ``none`` (no live key).

Hosts of no pool are counted under the pool ``None`` (``-`` in the table).

Two ways to the same counts: :func:`summarize` from joined hosts (what a
reader that has them, such as ``serve``, holds), and
:func:`allocator.status.summary_count.count_part` per part of a read, then
:func:`~allocator.status.summary_count.summary_of_counts` (what ``status
--summary`` does: no rows built). :func:`add_up` orders per-pool rows and
totals them for either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from allocator.errors import BadRecord
from allocator.records.holders import QueueEntry
from allocator.records.keys import split_host_key
from allocator.status.filters import gpu_states, holders_of, row_holders

if TYPE_CHECKING:
    from allocator.status.join import HostStatus
    from allocator.store import KeyValue

__all__ = [
    "COUNTS",
    "PoolSummary",
    "Summary",
    "add_up",
    "is_request",
    "queued_by_host",
    "summarize",
    "summary_document",
    "summary_table",
]

#: The counted columns, in table order.
COUNTS = (
    "hosts",
    "gpus",
    "free",
    "held",
    "idle",
    "unhealthy",
    "fallback",
    "reserved",
    "queued",
    "agents_down",
)
_DOWN = frozenset({"gone", "none"})


class PoolSummary(msgspec.Struct):
    """One pool's totals (``pool`` ``None``: hosts of no pool, or the total row)."""

    pool: str | None
    hosts: int = 0
    gpus: int = 0
    free: int = 0
    held: int = 0
    idle: int = 0
    unhealthy: int = 0
    fallback: int = 0
    reserved: int = 0
    queued: int = 0
    agents_down: int = 0

    def add(self, other: PoolSummary) -> None:
        """Add ``other``'s counts to this row's (written out: a fleet adds 12,500 rows)."""
        self.hosts += other.hosts
        self.gpus += other.gpus
        self.free += other.free
        self.held += other.held
        self.idle += other.idle
        self.unhealthy += other.unhealthy
        self.fallback += other.fallback
        self.reserved += other.reserved
        self.queued += other.queued
        self.agents_down += other.agents_down


class Summary(msgspec.Struct):
    """Every pool's row, by pool name (no pool last), and their total."""

    pools: list[PoolSummary]
    total: PoolSummary
    revision: int


def summarize(
    hosts: Iterable[HostStatus],
    pools: Mapping[str, str],
    queued: Mapping[str, int] | None = None,
    revision: int = 0,
) -> Summary:
    """Totals per pool of ``hosts``; ``pools``: each host's pool (``filters.pool_by_host``).

    ``queued``: waiting requests per host (hosts not in ``hosts`` are not counted).
    """
    rows: dict[str | None, PoolSummary] = {}
    for host in hosts:
        pool = pools.get(host.host)
        row = rows.get(pool)
        if row is None:
            row = rows[pool] = PoolSummary(pool)
        _count_host(row, host)
        row.queued += (queued or {}).get(host.host, 0)
    return add_up(rows.values(), revision)


def add_up(rows: Iterable[PoolSummary], revision: int = 0) -> Summary:
    """The summary of per-pool ``rows``: ordered by pool (no pool last), and their total."""
    ordered = sorted(rows, key=lambda r: (r.pool is None, r.pool or ""))
    total = PoolSummary(None)
    for row in ordered:
        total.add(row)
    return Summary(ordered, total, revision)


def is_request(value: bytes | None) -> bool:
    """Whether a queue key's ``value`` is a request (a damaged record waits for nothing)."""
    if value is None:
        return False
    try:
        QueueEntry.from_json(value)
    except BadRecord:
        return False
    return True


def queued_by_host(items: Iterable[KeyValue], queue: str) -> dict[str, int]:
    """Requests waiting per host among the queue's key-values ``items`` (``queue``: its prefix)."""
    queued: dict[str, int] = {}
    for item in items:
        parsed = split_host_key(item.key, queue)
        if parsed is not None and is_request(item.value):
            queued[parsed[0]] = queued.get(parsed[0], 0) + 1
    return queued


def _count_host(row: PoolSummary, host: HostStatus) -> None:
    row.hosts += 1
    if host.agent in _DOWN:
        row.agents_down += 1
    by_gpu = row_holders(host)
    for gpu in host.gpus:
        states = gpu_states(gpu, holders_of(gpu, by_gpu))
        if gpu.gpu == "cpu":
            row.fallback += "fallback" in states
            continue
        row.gpus += 1
        row.free += "free" in states
        row.held += "held" in states
        row.idle += "idle" in states
        row.unhealthy += "unhealthy" in states
        row.fallback += "fallback" in states
        row.reserved += bool(gpu.reserved)


def summary_document(summary: Summary) -> dict[str, Any]:
    """``status --summary -o json``: ``{"pools": [...], "total": {...}, "revision": N}``."""
    data: dict[str, Any] = msgspec.to_builtins(summary)
    return data


def summary_table(
    summary: Summary, render_table: Callable[[list[str], list[list[str]]], str]
) -> str:
    """The text form: a row per pool and a ``TOTAL`` row (``render_table(headers, rows)``)."""
    headers = ["POOL", *(name.upper().replace("_", " ") for name in COUNTS)]
    rows = [[row.pool or "-", *(str(getattr(row, n)) for n in COUNTS)] for row in summary.pools]
    rows.append(["TOTAL", *(str(getattr(summary.total, n)) for n in COUNTS)])
    return render_table(headers, rows)
