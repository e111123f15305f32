"""``status --summary`` on a fleet: counted from the hosts' keys, without the per-GPU rows (pure).

:func:`count_part` does for one part of a read what the join and
:func:`allocator.status.summary.summarize` do together, at a fraction of the
cost: each record is decoded into the few fields a count needs (msgspec
skips the rest), and no row, document or string is built per GPU. The
counts are the same as the join's (a test holds the two to it); a record
that does not decode is left out here without being reported (the full
``status`` names it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import msgspec

from allocator.errors import BadRecord
from allocator.records.host_counts import HostCounts
from allocator.records.keys import KeyLayout
from allocator.status.host_count import count_host
from allocator.status.summary import PoolSummary, Summary, add_up
from allocator.store import KeyValue

if TYPE_CHECKING:
    from allocator.policy.model import Policy

__all__ = ["HostCount", "count_part", "pool_counts", "reported_counts", "summary_of_counts"]


class _Held(msgspec.Struct):
    gpus: tuple[int, ...] = ()
    mode: str = "gpu"
    fallback_reason: str | None = None


class _Worker(msgspec.Struct):
    device: str = "cuda"
    fallback_reason: str | None = None
    idle_since: str | None = None


class _Gpu(msgspec.Struct):
    index: int


class _Agent(msgspec.Struct):
    gpus: tuple[_Gpu, ...] = ()
    unhealthy: dict[int, str] = {}


_HELD = msgspec.json.Decoder(_Held)
_WORKER = msgspec.json.Decoder(_Worker)
_AGENT = msgspec.json.Decoder(_Agent)
_COUNTS = msgspec.json.Decoder(HostCounts)


class HostCount(msgspec.Struct):
    """One host's counts (its ``pool`` field: the host's pool)."""

    host: str
    counts: PoolSummary


class _Host:
    __slots__ = ("agent", "agent_key", "held", "workers")

    def __init__(self) -> None:
        self.agent: _Agent | None = None
        self.agent_key = False
        self.held: dict[str, _Held] = {}
        self.workers: dict[str, _Worker] = {}


def count_part(
    policy: Policy | None,
    items: Sequence[KeyValue],
    layout: KeyLayout,
    now: datetime,
    declared: Iterable[str],
    pools: Mapping[str, str],
) -> list[HostCount]:
    """Counts of the hosts with keys in ``items`` and of the ``declared`` ones (as the join's)."""
    stored = _decoded(items, layout)
    names = sorted(set(stored).union(declared))
    return [
        HostCount(name, _count(policy, name, stored.get(name) or _Host(), now, pools.get(name)))
        for name in names
    ]


def reported_counts(
    policy: Policy | None,
    items: Sequence[KeyValue],
    layout: KeyLayout,
    now: datetime,
    pools: Mapping[str, str],
    on_bad: Callable[[BadRecord], None],
) -> dict[str, HostCount]:
    """The counts agents wrote under ``counts/``, by host: those a summary can use.

    A record is used only while leased (an agent keeps it; one written by
    hand is not the agent's), for the host its key names, with the GPUs
    it counted; one that does not decode is reported. A host left out is
    counted from its own records.
    """
    prefix = layout.counts
    found: dict[str, HostCount] = {}
    for item in items:
        name = item.key[len(prefix) :]
        if not item.key.startswith(prefix) or item.lease is None:
            continue
        try:
            counted = _COUNTS.decode(item.value)
        except msgspec.MsgspecError as exc:
            on_bad(BadRecord(item.key, str(exc)))
            continue
        if counted.host == name and counted.gpus:
            found[name] = HostCount(name, pool_counts(policy, counted, now, pools.get(name)))
    return found


def summary_of_counts(
    counts: Iterable[HostCount], queued: Mapping[str, int] | None = None, revision: int = 0
) -> Summary:
    """The summary (per pool, and the total) of hosts' counts; ``queued``: requests per host."""
    rows: dict[str | None, PoolSummary] = {}
    for host in counts:
        counted = host.counts
        row = rows.get(counted.pool)
        if row is None:
            row = rows[counted.pool] = PoolSummary(counted.pool)
        row.add(counted)
        row.queued += (queued or {}).get(host.host, 0)
    return add_up(rows.values(), revision)


def _decoded(items: Sequence[KeyValue], layout: KeyLayout) -> dict[str, _Host]:
    hosts: dict[str, _Host] = {}
    prefix = layout.hosts
    start = len(prefix)
    name, host = "", _Host()
    for item in items:
        key = item.key
        if not key.startswith(prefix):
            continue
        # <hosts><host>/<kind>[/<job>]: split_host_key's rule, inlined (a fleet has 175,000)
        where, slash, rest = key[start:].partition("/")
        kind, _, job = rest.partition("/")
        if not slash or "/" in job:
            continue
        if where != name:
            name = where
            host = hosts.get(name) or hosts.setdefault(name, _Host())
        try:
            if kind == "jobs":
                if job:
                    host.held[job] = _HELD.decode(item.value)
            elif kind == "workers":
                if job:
                    host.workers[job] = _WORKER.decode(item.value)
            elif kind == "agent" and not job:
                host.agent_key = True
                host.agent = _AGENT.decode(item.value)
        except msgspec.MsgspecError:  # damaged: the full status reports it
            continue
    return hosts


def _count(
    policy: Policy | None, name: str, host: _Host, now: datetime, pool: str | None
) -> PoolSummary:
    agent = host.agent
    indices = _indices(policy, name, agent)
    counted = count_host(name, host.held, host.workers, indices, agent.unhealthy if agent else {})
    summary = pool_counts(policy, counted, now, pool)
    summary.agents_down = 0 if host.agent_key else 1  # the agent gone, or never there
    return summary


def pool_counts(
    policy: Policy | None, counted: HostCounts, now: datetime, pool: str | None
) -> PoolSummary:
    """One host's row of a summary: its ``counted`` GPUs, those reserved now, in ``pool``."""
    reserved = _reserved(policy, counted.host, now)
    return PoolSummary(
        pool,
        hosts=1,
        gpus=len(counted.gpus),
        free=counted.free,
        held=counted.held,
        idle=counted.idle,
        unhealthy=counted.unhealthy,
        fallback=counted.fallback,
        reserved=len(reserved.intersection(counted.gpus)),
    )


def _indices(policy: Policy | None, name: str, agent: _Agent | None) -> Iterable[int]:
    if agent is not None and agent.gpus:
        return {gpu.index for gpu in agent.gpus}
    declared = policy.hosts.get(name) if policy is not None else None
    return range(declared.gpus) if declared is not None else ()


def _reserved(policy: Policy | None, name: str, now: datetime) -> set[int]:
    if policy is None or not policy.reservations:
        return set()
    from allocator.placement.reservations import on_host

    return {gpu for r in on_host(policy, name) if r.active(now) for gpu in r.gpus}
