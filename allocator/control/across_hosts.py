"""One job across several hosts: ``set job=J host=a,b`` and its release, each one transaction.

A set across hosts places the request on every host (``count=N`` picks N
GPUs on each, ``gpus=0-3`` takes the same GPUs on each) and writes every
share in one transaction that compares the policy's revision, every touched
host's generation key and the job's index: all hosts or none. The shares
name the job's ``nodes`` (node rank = the order given) and its one
``MASTER_PORT``, and so does the job index, the one record of the job as a
whole.

Rules worth knowing:

* The job is one thing: if any host can only give it the CPU (its fallback
  rule says ``cpu``), every share runs on the CPU, since a collective needs
  every rank on the same footing. A host the job held before and that is no
  longer named is released in the same transaction.
* A job across hosts is changed and released only as a whole; a change of
  one share alone is refused (:mod:`allocator.control.job_index`).
* ``MASTER_PORT`` is chosen at set time, on the first host's behalf
  (:mod:`allocator.control.master_port`).
* Every transaction fits every backend: :data:`MAX_JOB_HOSTS` hosts at most,
  leaving :data:`RESERVED_OPS_PER_HOST` operations per host for what other
  writes add to the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from allocator.control.gate import gated_placement
from allocator.control.job_index import group_index_change, index_for_write
from allocator.control.master_port import choose_master_port
from allocator.control.quotas import charge
from allocator.control.write_cache import policy_snapshot
from allocator.errors import RequestError
from allocator.history.append import prepare_append
from allocator.history.entries import change_entry, release_entry
from allocator.history.index import index_ops
from allocator.history.rollup import rollup_ops, rows_of
from allocator.history.stream import host_stream
from allocator.placement.vendors import check_one_vendor
from allocator.records.codec import replace_struct
from allocator.records.types import Assignment, HistoryEntry
from allocator.status.snapshots import job_not_found, no_policy_error, read_host
from allocator.store import MAX_TXN_OPS, Compare, Delete, Op, Put
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.control.writer import Writer
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy
    from allocator.policy.model import HistorySettings
    from allocator.status.snapshots import HostSnapshot, PolicySnapshot

__all__ = [
    "FIXED_OPS",
    "GANG_OPS_PER_HOST",
    "MAX_GANG_HOSTS",
    "MAX_JOB_HOSTS",
    "OPS_PER_HOST",
    "RESERVED_OPS_PER_HOST",
    "GroupResult",
    "GroupWrite",
    "as_one_job",
    "check_hosts",
    "describe_shares",
    "plan_group_release",
    "plan_group_set",
    "replace_share",
]

#: Operations a transaction spends on each host it touches: compare its
#: generation, write (or delete) the job's assignment, bump the generation.
OPS_PER_HOST = 3
#: Operations each touched host's history entry takes in the same transaction:
#: compare the host's history head, write the entry, drop the oldest, write the head.
RESERVED_OPS_PER_HOST = 4
#: Compare the policy, compare and write the job index, bump the fleet generation,
#: write the one pointer to the hosts' history entries in the fleet's index,
#: and the one usage row key of the holdings they end.
FIXED_OPS = 6
#: The most hosts one job may span (8 with a 64-operation transaction).
MAX_JOB_HOSTS = (MAX_TXN_OPS - FIXED_OPS) // (OPS_PER_HOST + RESERVED_OPS_PER_HOST)
#: Operations a gang's take adds on each host (its turn in the host's wait queue):
#: compare the host's arrivals key, compare and delete its own entry there.
GANG_OPS_PER_HOST = 3
#: The most hosts a job waiting across hosts (``set host=a,b --wait``) may span.
MAX_GANG_HOSTS = (MAX_TXN_OPS - FIXED_OPS) // (
    OPS_PER_HOST + RESERVED_OPS_PER_HOST + GANG_OPS_PER_HOST
)


@dataclass(frozen=True, slots=True)
class GroupResult:
    """What a set or release across hosts did.

    ``assignments`` are the shares written (set, in node-rank order) or
    removed (release; a damaged share is left out and named in ``damaged``);
    ``released`` are hosts the job no longer holds.
    """

    job: str
    nodes: tuple[str, ...]
    master_port: int | None
    assignments: tuple[Assignment, ...]
    released: tuple[str, ...] = ()
    damaged: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupWrite:
    """One transaction, ready for ``Allocator``, and what it does once applied."""

    compares: list[Compare]
    ops: list[Op]
    result: GroupResult


def check_hosts(job: str, hosts: Sequence[str]) -> tuple[str, ...]:
    """``hosts`` as a job's nodes: two or more, distinct, at most :data:`MAX_JOB_HOSTS`."""
    if len(hosts) < 2:
        raise RequestError(f"job {job!r}: a job across hosts needs two or more hosts")
    repeated = sorted({h for h in hosts if list(hosts).count(h) > 1})
    if repeated:
        raise RequestError(f"host={','.join(hosts)}: {repeated[0]} is listed twice")
    _check_size(job, len(hosts))
    return tuple(hosts)


def _check_size(job: str, touched: int) -> None:
    if touched > MAX_JOB_HOSTS:
        raise RequestError(
            f"job {job!r} would touch {touched} hosts in one transaction; at most "
            f"{MAX_JOB_HOSTS} (a store transaction holds {MAX_TXN_OPS} operations)"
        )


def as_one_job(job: str, placements: Mapping[str, Placement]) -> dict[str, Placement]:
    """Every host's placement, with the CPU for all when any host can give only the CPU."""
    on_cpu = [host for host, placed in placements.items() if placed.mode == "cpu"]
    if not on_cpu or len(on_cpu) == len(placements):
        return dict(placements)
    first = placements[on_cpu[0]]
    why = f"{on_cpu[0]}: {first.fallback_reason or 'assigned the CPU'}"
    note = f"job {job!r} runs on the CPU on every host, since {why}"
    return {
        host: replace_struct(
            placed, gpus=(), mode="cpu", fallback_reason=why, notes=(*placed.notes, note)
        )
        for host, placed in placements.items()
    }


def plan_group_set(
    writer: Writer,
    snapshot: PolicySnapshot,
    request: Request,
    hosts: Sequence[str],
    why: tuple[str, tuple[str, ...] | None],
    generation: bytes,
    gate: Gate | None = None,
) -> GroupWrite:
    """Place ``request`` on every host of ``hosts`` and build the one transaction writing it.

    ``why`` is the operator's reason and ad-hoc command (already allowed),
    recorded in every share with who and when. ``gate`` (a gang's turn in
    every host's wait queue) is asked on each host; any refusal refuses the
    whole job, and what it adds is compared and written in the same transaction.
    """
    job, layout = request.job, writer.layout
    nodes = check_hosts(job, hosts)
    now = writer.clock()
    template = _template(writer, snapshot, request, nodes[0], why)
    states = {host: _host(writer, host) for host in nodes}
    detected = {h: s.agent.vendor if s.agent is not None else None for h, s in states.items()}
    check_one_vendor(snapshot.policy, job, detected)
    each, gated = _place_each(snapshot.policy, request, states, now, gate)
    placed = as_one_job(job, each)
    held_here = any(job in state.assignments for state in states.values())
    writer.standing(snapshot.policy).check_owners(s.assignments.get(job) for s in states.values())
    indexed = snapshot.record.job_index and not held_here  # see writeview.settle_view
    entry = index_for_write(writer.store, layout, job, writer.on_bad_record, indexed=indexed)
    released = tuple(sorted(set(entry.hosts or ()) - set(nodes)))
    _check_size(job, len(nodes) + len(released))
    states.update({host: _host(writer, host) for host in released})
    port = choose_master_port(
        snapshot.policy, job, states[nodes[0]], states[nodes[0]].assignments.get(job)
    )
    shares = tuple(replace_share(template, host, placed[host], nodes, port) for host in nodes)
    index_compare, index_op = group_index_change(layout, entry, nodes, port)
    touched = (*nodes, *released)
    compares = [
        Compare(layout.policy, snapshot.revision),
        *(Compare(layout.host_generation(h), states[h].generation) for h in touched),
        index_compare,
    ]
    ops: list[Op] = [Put(layout.assignment(s.host, job), s.to_json()) for s in shares]
    ops += [Delete(layout.assignment(host, job)) for host in released]
    ops += _bumps(writer, touched, generation)
    ops.append(index_op)
    keep = snapshot.policy.history
    entries = [
        change_entry(states[s.host].assignments.get(job), s, writer.actor, s.updated_at, why[0])
        for s in shares
    ]
    entries += [
        release_entry(
            host, job, states[host].assignments.get(job), writer.actor, template.updated_at, ""
        )
        for host in released
    ]
    _with_history(writer, entries, keep, compares, ops)
    compares += gated[0]
    ops += gated[1]
    before = [a for a in (states[h].assignments.get(job) for h in touched) if a is not None]
    _with_charge(writer, snapshot.policy, before, shares, compares, ops)
    notes = tuple(n for host in nodes for n in placed[host].notes)
    notes += tuple(f"job {job!r} no longer holds anything on {host}" for host in released)
    return GroupWrite(compares, ops, GroupResult(job, nodes, port, shares, released, (), notes))


def _template(
    writer: Writer,
    snapshot: PolicySnapshot,
    request: Request,
    first: str,
    why: tuple[str, tuple[str, ...] | None],
) -> Assignment:
    """What every share records alike: who, when, why, what was asked, the command."""
    from allocator.placement.request import describe_request

    standing = writer.standing(snapshot.policy)
    return Assignment(
        job=request.job,
        host=first,
        gpus=(),
        mode="cpu",
        updated_by=writer.actor,
        updated_at=format_time(writer.clock()),
        reason=why[0],
        requested=describe_request(request),
        policy_revision=snapshot.revision,
        command=why[1],
        holder=standing.holder,
        charged=standing.charged,
    )


def _place_each(
    policy: Policy,
    request: Request,
    states: Mapping[str, HostSnapshot],
    now: datetime,
    gate: Gate | None,
) -> tuple[dict[str, Placement], tuple[list[Compare], list[Op]]]:
    """``place()`` on every host, as its agent's inventory and health say, each through ``gate``.

    Returns the placements and what the gate adds on all hosts together (a
    key compared on several hosts, such as a quota counter, once).
    """
    from allocator.placement.choose import place

    placements: dict[str, Placement] = {}
    compares: dict[str, Compare] = {}
    ops: list[Op] = []
    for host, state in states.items():

        def place_it(around: Mapping[int, str], host: str = host) -> Placement:
            agent = states[host].agent
            return place(
                policy,
                replace_struct(request, host=host),
                states[host].assignments,
                now,
                inventory=agent.gpus if agent and agent.gpus else None,
                unhealthy={**(agent.unhealthy if agent else {}), **around},
            )

        placements[host], (more_compares, more_ops, _) = gated_placement(
            place_it, gate, state, lambda placed: placed
        )
        compares.update((c.key, c) for c in more_compares if c.key not in compares)
        ops += more_ops
    return placements, (list(compares.values()), ops)


def replace_share(
    template: Assignment, host: str, placed: Placement, nodes: tuple[str, ...], port: int
) -> Assignment:
    """One host's share of the job, from the template and that host's placement."""

    return replace_struct(
        template,
        host=host,
        gpus=placed.gpus,
        mode=placed.mode,
        fallback_reason=placed.fallback_reason,
        nodes=nodes,
        master_port=port,
        slots=placed.slots,
        exclusive=placed.exclusive,
        picked=placed.picked,
    )


def plan_group_release(writer: Writer, job: str, generation: bytes, reason: str = "") -> GroupWrite:
    """Build the one transaction releasing ``job`` on every host where it holds anything.

    ``reason`` goes into every host's history entry.
    """

    layout = writer.layout
    entry = index_for_write(writer.store, layout, job, writer.on_bad_record)
    hosts = sorted(set(entry.hosts or ()) | set(entry.nodes))
    states = {host: _host(writer, host) for host in hosts}
    held: dict[str, Assignment] = {}
    damaged: list[str] = []
    for host, state in states.items():
        if job in state.assignments:
            held[host] = state.assignments[job]
        elif any(bad.key == layout.assignment(host, job) for bad in state.bad_records):
            damaged.append(host)
    touched = sorted([*held, *damaged])
    if not touched:
        raise job_not_found(job, None)
    bare = writer.standing(None)  # who writes; the policy is read only when it may matter
    foreign = [s for s in held.values() if s.holder and s.holder != bare.holder]
    if foreign and not bare.acts_for_policy:
        writer.standing(writer.known_policy()).check_owners(foreign)
    _check_size(job, len(touched))
    index_compare, index_op = group_index_change(layout, entry, (), None)
    compares = [*(Compare(layout.host_generation(h), states[h].generation) for h in touched)]
    compares.append(index_compare)
    ops: list[Op] = [Delete(layout.assignment(host, job)) for host in touched]
    ops += _bumps(writer, touched, generation)
    ops.append(index_op)
    at = format_time(writer.clock())
    entries = [
        release_entry(host, job, held.get(host), writer.actor, at, reason) for host in touched
    ]
    _with_history(writer, entries, None, compares, ops)
    if any(a.charged for a in held.values()):
        policy = _applied_policy(writer)
        _with_charge(writer, policy, list(held.values()), [], compares, ops)
    order = entry.nodes or tuple(touched)
    shares = tuple(held[h] for h in order if h in held)
    result = GroupResult(
        job, entry.nodes, entry.master_port, shares, tuple(touched), tuple(damaged)
    )
    return GroupWrite(compares, ops, result)


def _with_history(
    writer: Writer,
    entries: Sequence[HistoryEntry],
    keep: HistorySettings | None,
    compares: list[Compare],
    ops: list[Op],
) -> None:
    """Add each host's history entry to the transaction (compare its head, append, trim one),
    and one pointer to them all in the fleet's index (a pointer a host would not fit)."""
    written: list[str] = []
    for entry in entries:
        assert entry.host is not None  # every entry of an assignment change names its host
        stream = host_stream(writer.layout, entry.host)
        compare, appended = prepare_append(
            writer.store, stream, entry, keep, writer.on_bad_record, max_trim=0, indexed=False
        )
        compares.append(compare)
        ops += appended
        written.append(appended[0].key)  # the entry itself comes first
    if entries:
        ops += index_ops(writer.layout.history, entries[0].at, written, trim=False)
        ops += rollup_ops(writer.layout.history, written[0], rows_of(entries))


def _with_charge(
    writer: Writer,
    policy: Policy,
    before: Sequence[Assignment],
    after: Sequence[Assignment],
    compares: list[Compare],
    ops: list[Op],
) -> None:
    """Add the quota counters' compares and writes; refuse a transaction grown too large."""
    more_compares, more_ops = charge(writer, policy, before, after)
    if len(compares) + len(ops) + len(more_compares) + len(more_ops) > MAX_TXN_OPS:
        raise RequestError(
            f"job {before[0].job if before else after[0].job!r} spans too many hosts for its "
            f"holder's {len(more_ops)} quota counters in one transaction; use fewer hosts"
        )
    compares += more_compares
    ops += more_ops


def _host(writer: Writer, host: str) -> HostSnapshot:
    return read_host(writer.store, writer.layout, host, writer.on_bad_record)


def _applied_policy(writer: Writer) -> Policy:
    """The applied policy, read now; none: a ``RequestError`` telling how to apply one."""
    layout = writer.layout
    item = writer.store.get(layout.policy)
    snapshot = policy_snapshot(writer.store, layout, item, writer.on_bad_record)
    if snapshot is None:
        raise no_policy_error(writer.store.url)
    return snapshot.policy


def _bumps(writer: Writer, hosts: Sequence[str], generation: bytes) -> list[Op]:
    layout = writer.layout
    ops: list[Op] = [Put(layout.host_generation(host), generation) for host in hosts]
    ops.append(Put(layout.fleet_generation, generation))
    return ops


def describe_shares(shares: Sequence[Assignment]) -> str:
    """``gpus 0,1 on each`` when every share holds the same, else ``node1 gpus 0,1; node2 cpu``."""
    where = ["cpu" if s.mode == "cpu" else "gpus " + ",".join(map(str, s.gpus)) for s in shares]
    if len(set(where)) == 1 and shares:
        return f"{where[0]} on each"
    return "; ".join(f"{s.host} {w}" for s, w in zip(shares, where, strict=True))
