"""Which preemptible holdings a normal request takes GPUs back from (pure).

A ``--preemptible`` job uses GPUs no normal request waits for; a normal
request that cannot be placed, but would be if some preemptible holdings of
its host were gone, has those holdings stopped. Which ones: the fewest that
make it fit, and among as few, the youngest (the least work lost). A
holding already marked preempted counts as gone (it is stopping). A normal
holding is never chosen, and nothing is when the request would not fit
even with every preemptible holding gone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import combinations

from allocator.errors import PlacementRefused
from allocator.placement.choose import Placement, Request, place
from allocator.policy.model import Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["MAX_EXACT", "Preemption", "choose_preempted"]

#: Up to this many preemptible holdings every subset is tried; beyond, youngest first.
MAX_EXACT = 10


@dataclass(frozen=True, slots=True)
class Preemption:
    """The holdings to stop now (``jobs``), those already stopping, and where it lands then."""

    jobs: tuple[str, ...]
    stopping: tuple[str, ...]
    placement: Placement


@dataclass(frozen=True, slots=True)
class Host:
    """What placement needs of the host besides its holdings."""

    policy: Policy
    now: datetime
    inventory: Sequence[GpuInfo] | None = None
    unhealthy: Mapping[int, str] | None = None


def choose_preempted(
    request: Request, assignments: Mapping[str, Assignment], host: Host
) -> Preemption | None:
    """The preemptible holdings whose GPUs ``request`` needs; ``None`` when none would do.

    ``None`` also when the request is preemptible itself, or fits as things
    are (it needs no one's GPUs). ``jobs`` may be empty when the holdings
    already stopping are enough.
    """
    if request.preemptible:
        return None
    stopping = tuple(sorted(j for j, a in assignments.items() if a.preempted_by))
    held = {j: a for j, a in assignments.items() if j not in stopping}
    if _placed(request, assignments, host) is not None:
        return None
    enough = _placed(request, held, host) if stopping else None
    if enough is not None:  # what is stopping already makes it fit: wait for it
        return Preemption((), stopping, enough)
    candidates = _youngest_first([a for a in held.values() if a.preemptible])
    if _placed(request, _without(held, candidates), host) is None:
        return None  # it would not fit even with every preemptible holding gone
    for chosen in _subsets(candidates):
        placed = _placed(request, _without(held, chosen), host)
        if placed is not None:
            return Preemption(tuple(a.job for a in chosen), stopping, placed)
    return None  # not reached: every candidate gone made it fit


def _placed(
    request: Request, assignments: Mapping[str, Assignment], host: Host
) -> Placement | None:
    try:
        placed = place(host.policy, request, assignments, host.now, host.inventory, host.unhealthy)
    except PlacementRefused:
        return None
    return None if placed.mode == "cpu" and not request.cpu else placed


def _youngest_first(holdings: list[Assignment]) -> list[Assignment]:
    return sorted(holdings, key=lambda a: (a.updated_at, a.job), reverse=True)


def _without(held: Mapping[str, Assignment], gone: Sequence[Assignment]) -> dict[str, Assignment]:
    names = {a.job for a in gone}
    return {j: a for j, a in held.items() if j not in names}


def _subsets(candidates: list[Assignment]) -> Iterator[tuple[Assignment, ...]]:
    """Fewest first, youngest first among as many; past ``MAX_EXACT``, youngest prefixes."""
    if len(candidates) > MAX_EXACT:
        for size in range(1, len(candidates) + 1):
            yield tuple(candidates[:size])
        return
    for size in range(1, len(candidates) + 1):
        yield from combinations(candidates, size)
