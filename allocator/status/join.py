"""Who holds what: a pure join of the policy, assignments, agents and workers.

``build_status`` turns one prefix read over every host into rows; the CLI
only renders them. Time is passed in (reservations start and end).

An agent's liveness never compares clocks between machines: the agent's key
is leased, so it exists exactly while the agent keeps its lease alive.

* ``alive``: the key is there, under a lease;
* ``stale``: the agent says it can keep its lease but cannot read its
  assignments (its record's ``store_stale``), so it works from an old view;
* ``unleased``: the key is there without a lease (written by hand?), which
  proves nothing; the agent puts its own back on its next full read;
* ``gone``: no key, but worker records remain (the agent died, or cannot
  reach the store, with workers it ran);
* ``none``: no key and nothing recorded.

A job across several hosts is also shown as one (:func:`group_status`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from allocator.placement.choose import host_gpu_indices, pool_sharing
from allocator.placement.occupancy import Holding, gpu_holdings, usage_text
from allocator.placement.reservations import on_host, trespassers
from allocator.placement.time_limit import time_left_text
from allocator.policy import Policy
from allocator.policy.model import Reservation, Sharing
from allocator.records.keys import KeyLayout
from allocator.status.gpu_use import IdleInfo, idle_info, unassigned_by_gpu
from allocator.status.snapshots import HostSnapshot, snapshots_by_host
from allocator.store import KeyValue
from allocator.util.printable import printable

__all__ = [
    "GpuRow",
    "GroupShare",
    "GroupStatus",
    "HostStatus",
    "JobRow",
    "agent_state",
    "build_status",
    "group_status",
    "status_of_part",
]


class GpuRow(msgspec.Struct, frozen=True):
    """One GPU of one host and who holds it.

    ``holder`` names every holder (``infer,train(2)``: train holds two slots;
    ``(whole)``: an exclusive job in a shared pool); ``slots`` is the GPU's use
    in a shared pool (``3/4 slots``). A field that has nothing to say is
    ``None`` (a free GPU's ``holder``, an exclusive pool's ``slots``): the row
    is already the ``-o json`` document's shape (the table prints ``-``).
    """

    host: str
    gpu: str
    holder: str | None
    since: str | None
    reason: str | None
    health: str
    reserved: str | None
    #: Holders inside a reservation window in force that does not admit them.
    outside_reservation: str | None = None
    slots: str | None = None
    #: How long the holder's GPUs have been idle (None while busy or unmeasured), and
    #: whether that is past its idle rule.
    idle: str | None = None
    idle_holder: bool = False
    #: Processes the agent found on this GPU that no job there was given.
    unassigned: tuple[dict[str, Any], ...] = ()
    #: Who holds it: each holding job's ``holder`` (the authenticated user), once, in
    #: the order of ``holder``; None when free.
    user: str | None = None
    #: When the first holder's time limit ends (RFC 3339) and how long is left
    #: (``1h29m``); None when it has none.
    ends_at: str | None = None
    time_left: str | None = None


class JobRow(msgspec.Struct, frozen=True):
    """One job's desired assignment joined with what its agent reports.

    As in :class:`GpuRow`, a field with nothing to say is ``None`` (``workers``
    when no worker is reported, ``picked`` for an explicit GPU list).
    """

    host: str
    job: str
    gpus: str
    mode: str
    since: str | None
    by: str | None
    reason: str | None
    workers: str | None
    matches: bool | None
    #: A job across several hosts: all its hosts in node-rank order, and its port.
    nodes: tuple[str, ...] = ()
    master_port: int | None = None
    #: Why ``count=N`` picked the GPUs (``NVLink pair``).
    picked: str | None = None
    #: When all the job's GPUs went idle (RFC 3339; None while busy), for how long,
    #: the idle rule in force, and whether the job is past it (an idle holder).
    idle_since: str | None = None
    idle_seconds: float | None = None
    idle_rule: str | None = None
    idle_holder: bool = False
    #: Why the agent gave up on the job: the failed worker's last lines, and its log.
    output_tail: tuple[str, ...] = ()
    log_path: str | None = None
    #: Whether the job runs on CPU by its fallback rule (none of its GPUs could
    #: serve: none free when it asked, or one went unhealthy).
    fallback: bool = False
    #: Who holds the job's GPUs: its assignment's ``holder`` (None in older records).
    user: str | None = None
    #: When its time limit ends (RFC 3339); None when it has none.
    ends_at: str | None = None


class GroupShare(msgspec.Struct, frozen=True):
    """One host's share of a job across hosts: what it holds, its agent, its workers.

    ``gpus`` is ``0,1``, ``cpu``, or empty when the host holds no share of the
    job (its record was removed or damaged by hand).
    """

    host: str
    rank: int
    gpus: str
    agent: str
    workers: str
    matches: bool | None


class GroupStatus(msgspec.Struct, frozen=True):
    """A job across several hosts, shown as one."""

    job: str
    nodes: tuple[str, ...]
    master_port: int | None
    shares: tuple[GroupShare, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready form."""
        return {**_fields(self), "shares": tuple(map(_fields, self.shares))}

    def summary(self) -> str:
        """One line: ``train across node1,node2 (MASTER_PORT 2345): node1 rank 0 ...``."""
        port = f" (MASTER_PORT {self.master_port})" if self.master_port else ""
        parts = "; ".join(map(_share_text, self.shares))
        return f"{self.job} across {','.join(self.nodes)}{port}: {parts}"


def _share_text(share: GroupShare) -> str:
    """``node2 rank 1 gpus 0,1: running pid 11``, saying so when no agent stands behind it."""
    held = {"": "NO SHARE", "cpu": "cpu"}.get(share.gpus, f"gpus {share.gpus}")
    head = f"{share.host} rank {share.rank} {held}"
    if share.agent == "none":  # nothing recorded there at all: no workers to speak of
        return f"{head}, no agent"
    agent = "" if share.agent == "alive" else f", agent {share.agent}"
    if not share.gpus:
        return f"{head}{agent}"
    if share.workers == "-":
        return f"{head}{agent}: no worker reported"
    if share.agent in ("gone", "unleased"):  # the record outlived its agent: no sync to claim
        return f"{head}, AGENT {share.agent.upper()}: last reported {share.workers}"
    sync = " (NOT in sync)" if share.matches is False else ""
    return f"{head}{agent}: {share.workers}{sync}"


class HostStatus(msgspec.Struct, frozen=True):
    """One host: agent liveness, its GPUs, its jobs."""

    host: str
    agent: str
    gpus: tuple[GpuRow, ...]
    jobs: tuple[JobRow, ...]
    bad_records: tuple[str, ...] = ()
    #: Whose GPUs the host has: its agent's finding, else the policy's ("" unknown).
    vendor: str = ""
    #: The policy's vendor for the host against the agent's finding, when they differ.
    vendor_mismatch: str = ""
    #: Where the agent's GPU list came from (``nvml``, ``amdsmi``, ...; ``declared``: no
    #: library answered and the policy's count stands in; ``none``); "" with no agent record.
    inventory: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready form: every field, rows as dicts, tuples as lists (all new)."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


#: A struct's fields as a dict, one level deep (in C).
_fields = msgspec.structs.asdict


def build_status(
    policy: Policy | None,
    items: Sequence[KeyValue],
    layout: KeyLayout,
    now: datetime,
    only_host: str | None = None,
) -> list[HostStatus]:
    """Join everything under the hosts prefix into per-host status."""
    declared = policy.hosts if policy is not None else ()
    return status_of_part(policy, items, layout, now, declared, only_host)


def status_of_part(
    policy: Policy | None,
    items: Sequence[KeyValue],
    layout: KeyLayout,
    now: datetime,
    declared: Iterable[str],
    only_host: str | None = None,
) -> list[HostStatus]:
    """Status of the hosts with keys in ``items`` and of the ``declared`` hosts, by name.

    ``items``: every key of those hosts (a part of the hosts prefix cut
    between hosts, or all of it); ``declared``: the policy's hosts whose
    keys would be in that part. Parts joined one by one make the same rows
    as :func:`build_status` of the whole.
    """
    stored = snapshots_by_host(items, layout, 0)
    names = [only_host] if only_host is not None else sorted(set(stored).union(declared))
    agent_keys = {item.key: item for item in items if item.key.endswith("/agent")}
    # Not layout.agent(name): a name from a key written by hand may be no valid name
    # (``-x``, ``bad name``), and status shows that host with its bad records, not a crash.
    prefix = layout.hosts
    hosts = []
    for name in names:
        snapshot = stored.get(name, HostSnapshot(name))
        agent = agent_state(agent_keys.get(f"{prefix}{name}/agent"), snapshot)
        hosts.append(_host_status(policy, snapshot, agent, now))
    return hosts


def group_status(hosts: Sequence[HostStatus]) -> list[GroupStatus]:
    """Every job across hosts found in ``hosts``, one entry each (a share not found: missing)."""
    rows = {(row.host, row.job): (host, row) for host in hosts for row in host.jobs}
    groups: dict[str, tuple[str, ...]] = {}
    ports: dict[str, int | None] = {}
    for _host, row in rows.values():
        if row.nodes and row.job not in groups:
            groups[row.job], ports[row.job] = row.nodes, row.master_port
    agents = {host.host: host.agent for host in hosts}
    found = []
    for job, nodes in sorted(groups.items()):
        shares = []
        for rank, node in enumerate(nodes):
            held = rows.get((node, job))
            if held is None or held[1].nodes != nodes:
                shares.append(GroupShare(node, rank, "", agents.get(node, "none"), "-", None))
                continue
            host, row = held
            workers = row.workers or "-"
            shares.append(GroupShare(node, rank, row.gpus, host.agent, workers, row.matches))
        found.append(GroupStatus(job, nodes, ports[job], tuple(shares)))
    return found


def agent_state(key: KeyValue | None, snapshot: HostSnapshot) -> str:
    """``alive``, ``stale``, ``unleased``, ``gone`` or ``none`` (see the module docstring).

    ``key`` is the host's agent key as read; its lease, not a timestamp, says
    the agent lives. A key whose body is damaged but whose lease lives is an
    agent alive (its record is listed among the bad records).
    """
    if key is None:
        return "gone" if snapshot.workers else "none"
    if key.lease is None:
        return "unleased"
    if snapshot.agent is not None and snapshot.agent.store_stale:
        return "stale"
    return "alive"


def _host_status(
    policy: Policy | None, snapshot: HostSnapshot, agent: str, now: datetime
) -> HostStatus:
    host, record, assignments = snapshot.host, snapshot.agent, snapshot.assignments
    inventory = record.gpus if record is not None and record.gpus else None
    indices: tuple[int, ...] = ()
    if policy is not None and (host in policy.hosts or inventory):
        indices = host_gpu_indices(policy, host, inventory)
    elif inventory:
        indices = tuple(g.index for g in inventory)
    holdings = gpu_holdings(assignments)
    idle = {
        job: idle_info(policy, host, job, snapshot.workers.get(job), now) for job in assignments
    }
    gpu_row = _GpuRows(policy, snapshot, holdings, idle, now)
    rows = [gpu_row(index) for index in sorted(set(indices).union(holdings))]
    for job, held in sorted(assignments.items()):
        if held.mode == "cpu":
            cells = (host, "cpu", job, held.updated_at or None, held.reason or None, "-")
            rows.append(
                GpuRow(
                    *cells,
                    reserved=None,
                    user=held.holder or None,
                    ends_at=held.ends_at or None,
                    time_left=time_left_text(held.ends_at, now) or None,
                )
            )
    job_rows = tuple(_job_row(snapshot, job, idle[job]) for job in sorted(assignments))
    bad = tuple(map(str, snapshot.bad_records))
    vendor, mismatch = _vendor(policy, snapshot)
    source = record.inventory_source if record is not None else ""
    return HostStatus(host, agent, tuple(rows), job_rows, bad, vendor, mismatch, source)


class _GpuRows:
    """Makes one host's GPU rows: what every row of the host shares, worked out once.

    A fleet's status makes 8,000 rows at 1,000 hosts, most of them held by
    one job in an exclusive pool, or free: those take the short ways.
    """

    __slots__ = (
        "holdings",
        "host",
        "idle",
        "labels",
        "now",
        "outside",
        "sharing",
        "snapshot",
        "strays",
        "unhealthy",
    )

    def __init__(
        self,
        policy: Policy | None,
        snapshot: HostSnapshot,
        holdings: dict[int, list[Holding]],
        idle: dict[str, IdleInfo],
        now: datetime,
    ) -> None:
        self.host, self.snapshot, self.holdings, self.idle, self.now = (
            snapshot.host,
            snapshot,
            holdings,
            idle,
            now,
        )
        record = snapshot.agent
        self.unhealthy = record.unhealthy if record is not None else {}
        self.strays = unassigned_by_gpu(record)
        self.sharing = pool_sharing(policy, snapshot.host) if policy is not None else _EXCLUSIVE
        self.labels: dict[int, str] = {}
        self.outside: dict[int, str] = {}
        active = _active_reservations(policy, snapshot.host, now)
        if active and policy is not None:
            self.labels = _reservation_labels(active)
            holders = {index: [hold.job for hold in holds] for index, holds in holdings.items()}
            self.outside = trespassers(policy, snapshot.host, holders, now, snapshot.assignments)

    def __call__(self, index: int) -> GpuRow:
        trouble = self.unhealthy.get(index)
        health = "ok" if trouble is None else f"unhealthy: {trouble}"
        holds = self.holdings.get(index)
        if not holds:
            label = self.labels.get(index) or None
            strays = self.strays.get(index, ())
            slots = usage_text((), self.sharing) or None if self.sharing.shared else None
            cells = (self.host, str(index), None, None, None, health, label)
            return GpuRow(*cells, slots=slots, unassigned=strays)
        first = self.snapshot.assignments[holds[0].job]
        first_idle = self.idle[holds[0].job]
        trespass = self.outside.get(index, "")
        sharing = self.sharing
        alone = len(holds) == 1 and not sharing.shared
        return GpuRow(
            host=self.host,
            gpu=str(index),
            holder=holds[0].job if alone else _holders(holds, sharing) or None,
            since=first.updated_at or None,
            reason=first.reason or None,
            health=health,
            reserved=_flagged(self.labels.get(index, ""), trespass) or None,
            outside_reservation=trespass or None,
            slots=None if not sharing.shared else usage_text(holds, sharing) or None,
            idle=first_idle.label or None,
            idle_holder=first_idle.holder,
            unassigned=self.strays.get(index, ()),
            user=first.holder or None if alone else _users(holds, self.snapshot) or None,
            ends_at=first.ends_at or None,
            time_left=time_left_text(first.ends_at, self.now) or None if first.ends_at else None,
        )


#: No sharing: what a host outside any pool with slots has.
_EXCLUSIVE = Sharing()


def _vendor(policy: Policy | None, snapshot: HostSnapshot) -> tuple[str, str]:
    """The host's vendor, and what is wrong when the policy says another one."""
    found = snapshot.agent.vendor if snapshot.agent is not None else ""
    said = policy.vendor_of(snapshot.host) if policy is not None else None
    if found and said and found != said:
        return found, f"the policy says {said} GPUs, the agent found {found}"
    return found or said or "", ""


def _job_row(snapshot: HostSnapshot, job: str, idle: IdleInfo) -> JobRow:
    held = snapshot.assignments[job]
    worker = snapshot.workers.get(job)
    matches: bool | None = None
    workers: str | None = None
    fallback = held.mode == "cpu" and bool(held.fallback_reason)
    if worker is not None:
        workers = worker.state + (f" pid {','.join(map(str, worker.pids))}" if worker.pids else "")
        on_cpu = worker.device == "cpu"
        if on_cpu and held.mode == "gpu" and worker.fallback_reason:
            # A fallback rule at work (a GPU is unhealthy): what the policy asks for.
            workers += f" on CPU ({worker.fallback_reason})"
            matches = fallback = True
        else:
            matches = worker.gpus == held.gpus and on_cpu == (held.mode == "cpu")
        if worker.state == "finished" and worker.message.startswith("finished"):
            workers = worker.message  # finished (exit 0)[; its GPUs released ...]
        elif not worker.pids and worker.message:
            workers += f": {worker.message}"
    gpus = "cpu" if held.mode == "cpu" else ",".join(map(str, held.gpus))
    return JobRow(
        host=snapshot.host,
        job=job,
        gpus=gpus,
        mode=held.mode,
        since=held.updated_at or None,
        by=held.updated_by or None,
        reason=held.reason or held.fallback_reason or None,
        workers=workers,
        matches=matches,
        nodes=held.nodes,
        master_port=held.master_port,
        picked=held.picked or None,
        idle_since=idle.since,
        idle_seconds=idle.seconds,
        idle_rule=idle.rule or None,
        idle_holder=idle.holder,
        output_tail=tuple(map(printable, worker.output_tail)) if worker else (),
        log_path=printable(worker.log_path) or None if worker and worker.log_path else None,
        fallback=fallback,
        user=held.holder or None,
        ends_at=held.ends_at or None,
    )


def _holders(holds: list[Holding], sharing: Sharing) -> str:
    """Every holder, with its share where it holds more than one slot (or the GPU whole)."""
    if not sharing.shared:
        return ",".join(hold.job for hold in holds)
    return ",".join(
        hold.job + ("(whole)" if hold.exclusive else f"({hold.slots})" if hold.slots > 1 else "")
        for hold in holds
    )


def _users(holds: list[Holding], snapshot: HostSnapshot) -> str:
    """Who holds a GPU: each holding job's holder, once, in the order of its holders."""
    users = (snapshot.assignments[hold.job].holder for hold in holds)
    return ",".join(dict.fromkeys(user for user in users if user))


def _flagged(label: str, outside: str) -> str:
    """The RESERVED column: the reservation, and a holder it does not admit, loudly."""
    return f"{label}: HELD OUTSIDE IT ({outside})" if outside else label


def _active_reservations(
    policy: Policy | None, host: str, now: datetime
) -> tuple[Reservation, ...]:
    """The reservations of ``host`` whose window is in force at ``now``."""
    if policy is None:
        return ()
    return tuple(r for r in on_host(policy, host) if r.active(now))


def _reservation_labels(active: Iterable[Reservation]) -> dict[int, str]:
    """GPU -> the RESERVED column's label, of the reservations in force there."""
    labels: dict[int, str] = {}
    for reservation in active:
        for gpu in reservation.gpus:
            labels[gpu] = f"{reservation.name} ({','.join(reservation.for_jobs)})"
    return labels
