"""Pure placement decisions: is this assignment legal, and which GPUs for ``count=N``?

Everything here is a function of plain data (the policy, the host's current
assignments, the time, the agent's inventory and health); nothing reads a
store, a clock or a device. :func:`place` is the single entry point.

Choices worth knowing:

* The inventory (from the agent, via NVML) wins over the policy's declared
  GPU count when present; an empty inventory means the host has no GPUs.
* A job's own current assignment never conflicts with itself, so re-setting
  or moving a job is legal.
* An explicit request for an unhealthy GPU is allowed with a note: the
  operator named the GPU on purpose (perhaps re-assigning it deliberately
  after a repair), and the agent's health handling still applies the job's
  fallback if the GPU is really broken. ``count=N`` never picks one.
* ``count=N`` ranks candidate sets as :mod:`allocator.placement.ranking` says: GPUs a
  reservation will take from the job later first, then (in a shared pool)
  free capacity, then links (NVLink, PCIe, NUMA), moves, and the lowest
  indices; its cost is linear in the host's size. The placement says why it
  picked them (``NVLink pair``).
* In a shared pool a GPU has slots (:mod:`allocator.placement.occupancy`): a request takes
  one of each GPU's (``slots=K``: K), a job the policy marks ``exclusive``
  takes GPUs whole. In an MPS pool a worker sees one GPU (one MPS control
  daemon per GPU), so a ``workers: single`` job asks for one GPU there.
* An explicit ``gpus=`` list is honoured as given, with a note when it spans
  CPU sockets.
* A GPU whose reservation for other jobs starts later is given with a note
  (``set`` prints it): the job will lose it when the window opens.
* A request larger than the host (or a pool limit) is impossible as asked
  (:class:`RequestError`, exit 2); GPUs busy right now is a conflict
  (:class:`PlacementRefused`, exit 3). A job whose fallback rule says ``cpu``
  gets a CPU placement instead of either conflict or a too-small host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from msgspec import Struct

from allocator.errors import PlacementRefused, RequestError
from allocator.placement.occupancy import Holding, gpu_holdings, refusal, slots_in_use
from allocator.placement.request import Ask, Request, ask_of, pool_sharing
from allocator.placement.reservations import (
    describe_reservation,
    reserved_against,
    reserved_later,
    unavailable_gpus,
)
from allocator.policy.model import Policy, Reservation, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment
from allocator.util.printable import printable
from allocator.util.times import format_time

if TYPE_CHECKING:  # only count=N ranks, and only a multi-GPU list reads links: load them then
    from allocator.placement.ranking import Ranking

__all__ = [
    "Placement",
    "Request",
    "gpu_blockers",
    "gpu_holders",
    "host_gpu_indices",
    "place",
    "pool_sharing",
    "unavailable_gpus",
]


class Placement(Struct, frozen=True):
    """The decision: which GPUs the job gets (none in ``cpu`` mode), and why.

    ``slots`` and ``exclusive`` are the job's hold on each GPU; ``picked`` is
    why ``count=N`` chose these GPUs (``NVLink pair``).
    """

    gpus: tuple[int, ...]
    mode: Literal["gpu", "cpu"]
    fallback_reason: str | None = None
    notes: tuple[str, ...] = ()
    slots: int = 1
    exclusive: bool = False
    picked: str = ""


# --- facts about a host --------------------------------------------------------


def host_gpu_indices(
    policy: Policy, host: str, inventory: Sequence[GpuInfo] | None
) -> tuple[int, ...]:
    """The GPU indices of ``host``: the inventory's when given, else the policy's count.

    Raises :class:`RequestError` for a host neither in the policy nor reporting
    an inventory.
    """
    if inventory is not None:
        return tuple(sorted({gpu.index for gpu in inventory}))
    declared = policy.hosts.get(host)
    if declared is None:
        raise _not_in_policy(policy, host)
    return tuple(range(declared.gpus))


def _not_in_policy(policy: Policy, host: str) -> RequestError:
    names = sorted(policy.hosts)
    known = ", ".join(names[:10]) or "none"  # a fleet's policy names thousands
    known += f" and {len(names) - 10:,} more" if len(names) > 10 else ""
    return RequestError(f"host '{host}' is not in the policy (hosts: {known})")


def gpu_holders(assignments: Mapping[str, Assignment]) -> dict[int, list[str]]:
    """GPU index -> the jobs holding it (sorted), from GPU-mode assignments."""
    holders: dict[int, list[str]] = {}
    for job, assignment in sorted(assignments.items()):
        if assignment.mode != "gpu":
            continue  # a CPU-mode job holds no GPU whatever its record says
        for gpu in assignment.gpus:
            holders.setdefault(gpu, []).append(job)
    return dict(sorted(holders.items()))


def gpu_blockers(
    policy: Policy,
    host: str,
    job: str,
    assignments: Mapping[str, Assignment],
    now: datetime,
    inventory: Sequence[GpuInfo] | None = None,
    unhealthy: Mapping[int, str] | None = None,
    slots: int = 1,
    asker: Sequence[str] = (),
    *,
    self_service: bool = False,
) -> dict[int, str]:
    """GPU index -> why ``job`` (asking ``slots``) cannot be given that GPU by ``count=N`` now.

    GPUs absent from the result are free for ``job`` (possibly shared with
    others in a shared pool). Reasons are short: ``held by job 'a'``,
    ``reserved by 'r' for eval-* until ...``, ``unhealthy: XID 79``.
    """
    indices = host_gpu_indices(policy, host, inventory)
    sharing = pool_sharing(policy, host)
    spec = policy.jobs.get(job)
    exclusive = spec is not None and spec.exclusive
    holdings = gpu_holdings(assignments)
    reserved = reserved_against(policy, host, job, now, None, asker, self_service=self_service)
    sick = unhealthy or {}
    reasons: dict[int, str] = {}
    for gpu in indices:
        others = [hold for hold in holdings.get(gpu, []) if hold.job != job]
        names = ", ".join(f"job '{hold.job}'" for hold in others)
        held = refusal(sharing, others, names, job, slots, exclusive)
        if gpu in sick:
            reasons[gpu] = f"unhealthy: {sick[gpu]}"
        elif held is not None:
            reasons[gpu] = held
        elif gpu in reserved:
            reasons[gpu] = describe_reservation(reserved[gpu])
    return reasons


# --- wording -------------------------------------------------------------------


def _describe_holder(assignment: Assignment | None, job: str) -> str:
    details = []
    if assignment is not None and assignment.updated_at:
        details.append(f"since {printable(assignment.updated_at)}")
    if assignment is not None and assignment.updated_by:
        details.append(f"by {printable(assignment.updated_by)}")
    return f"job '{job}'" + (f" ({', '.join(details)})" if details else "")


def _later_note(host: str, job: str, gpu: int, reservation: Reservation) -> str:
    start = format_time(reservation.start) if reservation.start is not None else "now"
    return (
        f"GPU {gpu} on {host} is {describe_reservation(reservation)} from {start}; "
        f"job '{job}' loses it then (its fallback rule applies)"
    )


def _ranges(indices: Sequence[int]) -> str:
    """``GPUs 0-3, 6`` for (0, 1, 2, 3, 6); ``no GPUs`` for ()."""
    if not indices:
        return "no GPUs"
    runs: list[list[int]] = []
    for gpu in sorted(indices):
        if runs and gpu == runs[-1][-1] + 1:
            runs[-1].append(gpu)
        else:
            runs.append([gpu])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    return "GPUs " + ", ".join(parts)


# --- the entry point -------------------------------------------------------------


def place(
    policy: Policy,
    request: Request,
    assignments: Mapping[str, Assignment],
    now: datetime,
    inventory: Sequence[GpuInfo] | None = None,
    unhealthy: Mapping[int, str] | None = None,
) -> Placement:
    """Decide the placement of ``request`` on its host, or refuse it.

    ``assignments`` are the host's current assignments (job -> record);
    ``now`` must be timezone-aware; ``unhealthy`` maps GPU index -> reason.
    Raises :class:`RequestError` (exit 2) for an unknown host, a GPU that does
    not exist, a request over the pool's per-job limit or larger than the
    host; :class:`PlacementRefused` (exit 3) when GPUs are held by other jobs
    or reserved for others.
    """
    if now.tzinfo is None:
        raise ValueError("place() needs a timezone-aware 'now'")
    if not policy.names_host(request.host):  # an agent's inventory does not put it back
        raise _not_in_policy(policy, request.host)
    indices = host_gpu_indices(policy, request.host, inventory)
    if request.gpus is not None:
        return _place_explicit(
            policy, request, request.gpus, assignments, now, indices, unhealthy or {}, inventory
        )
    if request.count is not None:
        return _place_count(
            policy, request, request.count, assignments, now, inventory, unhealthy or {}
        )
    return Placement(gpus=(), mode="cpu")


def _check_pool_limit(policy: Policy, host: str, job: str, count: int) -> None:
    pool = policy.pool_of(host)
    if pool is not None and pool.max_gpus_per_job is not None and count > pool.max_gpus_per_job:
        raise RequestError(
            f"job '{job}' asks for {count} GPUs; pool '{pool.name}' allows at most "
            f"{pool.max_gpus_per_job} per job"
        )


def _place_explicit(
    policy: Policy,
    request: Request,
    gpus: tuple[int, ...],
    assignments: Mapping[str, Assignment],
    now: datetime,
    indices: tuple[int, ...],
    unhealthy: Mapping[int, str],
    inventory: Sequence[GpuInfo] | None,
) -> Placement:
    host, job = request.host, request.job
    present = set(indices)
    missing = [g for g in gpus if g not in present]
    if missing:
        verb = "does" if len(missing) == 1 else "do"
        listed = ", ".join(str(g) for g in missing)
        raise RequestError(f"GPU {listed} {verb} not exist on {host} ({_ranges(indices)})")
    _check_pool_limit(policy, host, job, len(gpus))
    ask = ask_of(policy, request, len(gpus))
    sharing = pool_sharing(policy, host)
    holdings = gpu_holdings(assignments)
    who = (request.asker, request.self_service)
    reserved = reserved_against(policy, host, job, now, gpus, who[0], self_service=who[1])
    later = reserved_later(policy, host, job, now, gpus, who[0], self_service=who[1])
    conflicts: list[str] = []
    notes: list[str] = []
    for gpu in gpus:
        others = [hold for hold in holdings.get(gpu, []) if hold.job != job]
        held = " and ".join(_describe_holder(assignments.get(h.job), h.job) for h in others)
        refused = refusal(sharing, others, held, job, ask.slots, ask.exclusive)
        if refused is not None:
            conflicts.append(f"GPU {gpu} on {host} is {refused}")
        elif others:
            notes.append(f"GPU {gpu} on {host} is shared with {held}{_after(others, ask, sharing)}")
        if gpu in reserved:
            conflicts.append(f"GPU {gpu} on {host} is {describe_reservation(reserved[gpu])}")
        elif gpu in later:
            notes.append(_later_note(host, job, gpu, later[gpu]))
        if gpu in unhealthy:
            notes.append(f"GPU {gpu} on {host} is unhealthy: {unhealthy[gpu]}")
    if conflicts:
        raise PlacementRefused("; ".join(conflicts))
    notes.extend(_socket_note(host, gpus, inventory))
    return Placement(gpus, "gpu", None, tuple(notes), ask.slots, ask.exclusive)


def _after(others: Sequence[Holding], ask: Ask, sharing: Sharing) -> str:
    """`` (3/4 slots in use with this job)`` where the pool counts slots."""
    if sharing.capacity is None:
        return ""
    used = slots_in_use(others, sharing) + ask.slots
    return f" ({used}/{sharing.capacity} slots in use with this job)"


def _socket_note(host: str, gpus: Sequence[int], inventory: Sequence[GpuInfo] | None) -> list[str]:
    """A note for an explicit list whose GPUs sit under different CPU sockets."""
    if len(gpus) < 2:
        return []
    from allocator.gpus.topology import Links

    links = Links.of(inventory)
    if not links.crosses_sockets(gpus):
        return []
    nodes = links.sockets(gpus)
    where = f"NUMA nodes {', '.join(map(str, nodes))}" if nodes else "CPU sockets"
    return [
        f"GPUs {','.join(map(str, gpus))} on {host} span {where}: traffic between them "
        "crosses the CPU interconnect (count= would keep them on one node where it can)"
    ]


def _place_count(
    policy: Policy,
    request: Request,
    count: int,
    assignments: Mapping[str, Assignment],
    now: datetime,
    inventory: Sequence[GpuInfo] | None,
    unhealthy: Mapping[int, str],
) -> Placement:
    host, job = request.host, request.job
    _check_pool_limit(policy, host, job, count)
    ask = ask_of(policy, request, count)
    indices = host_gpu_indices(policy, host, inventory)
    rule = policy.fallback_for(job)
    falls_back = rule is not None and rule.action == "cpu"
    if count > len(indices):
        if falls_back:
            reason = f"{host} has {len(indices)} GPUs: {count} requested"
            return Placement(gpus=(), mode="cpu", fallback_reason=reason)
        raise RequestError(
            f"job '{job}' asks for {count} GPUs; {host} has {len(indices)} ({_ranges(indices)})"
        )
    blockers = gpu_blockers(
        policy,
        host,
        job,
        assignments,
        now,
        inventory,
        unhealthy,
        slots=ask.slots,
        asker=request.asker,
        self_service=request.self_service,
    )
    candidates = [g for g in indices if g not in blockers]
    if len(candidates) < count:
        busy = "; ".join(f"{g}: {why}" for g, why in sorted(blockers.items()))
        shortage = f"{count} requested, {len(candidates)} free ({busy})"
        if falls_back:
            reason = f"not enough free GPUs on {host}: {shortage}"
            return Placement(gpus=(), mode="cpu", fallback_reason=reason)
        raise PlacementRefused(f"not enough free GPUs on {host} for job '{job}': {shortage}")
    later = reserved_later(
        policy, host, job, now, candidates, request.asker, self_service=request.self_service
    )
    ranking = _ranking(policy, request, inventory, assignments, frozenset(later))
    chosen = ranking.choose(candidates, count)
    notes = tuple(_later_note(host, job, gpu, later[gpu]) for gpu in chosen if gpu in later)
    picked = ranking.explain(chosen)
    return Placement(chosen, "gpu", None, notes, ask.slots, ask.exclusive, picked)


def _ranking(
    policy: Policy,
    request: Request,
    inventory: Sequence[GpuInfo] | None,
    assignments: Mapping[str, Assignment],
    later: frozenset[int],
) -> Ranking:
    from allocator.placement.ranking import Ranking

    sharing = pool_sharing(policy, request.host)
    load: dict[int, int] = {}  # in an exclusive pool a held GPU is no candidate anyway
    for gpu, holds in gpu_holdings(assignments).items() if sharing.shared else ():
        others = [hold for hold in holds if hold.job != request.job]
        if others:
            load[gpu] = slots_in_use(others, sharing)
    mine = assignments.get(request.job)
    own = frozenset(mine.gpus) if mine is not None and mine.mode == "gpu" else frozenset()
    return Ranking.build(inventory, load, own, later, request.prefer)
