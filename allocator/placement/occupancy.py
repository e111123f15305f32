"""Who holds how much of each GPU: slots in shared pools, whole GPUs otherwise (pure).

A pool's :class:`~allocator.policy.model.Sharing` gives each GPU a capacity:
1 when exclusive, ``slots`` in a time-slice or MPS pool, none for the old
unlimited ``shared``. An assignment takes its ``slots`` of each of its GPUs;
an ``exclusive`` one takes a GPU whole, whatever the pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct

from allocator.policy.model import Sharing
from allocator.records.types import Assignment

__all__ = ["Holding", "gpu_holdings", "refusal", "slots_in_use", "usage_text"]


class Holding(Struct, frozen=True):
    """One job's hold on one GPU."""

    job: str
    slots: int = 1
    exclusive: bool = False


def gpu_holdings(assignments: Mapping[str, Assignment]) -> dict[int, list[Holding]]:
    """GPU index -> the holds on it (by job name), from GPU-mode assignments."""
    holdings: dict[int, list[Holding]] = {}
    for job, assignment in sorted(assignments.items()):
        if assignment.mode != "gpu":
            continue  # a CPU-mode job holds no GPU whatever its record says
        hold = Holding(job, assignment.slots, assignment.exclusive)
        for gpu in assignment.gpus:
            holdings.setdefault(gpu, []).append(hold)
    return dict(sorted(holdings.items()))


def slots_in_use(holds: Sequence[Holding], sharing: Sharing) -> int:
    """Slots ``holds`` take of a GPU: all of them for an exclusive hold or an exclusive pool."""
    capacity = sharing.capacity
    if any(hold.exclusive for hold in holds) or not sharing.shared:
        return (capacity or max(1, sum(hold.slots for hold in holds))) if holds else 0
    return sum(hold.slots for hold in holds)


def refusal(
    sharing: Sharing, others: Sequence[Holding], names: str, job: str, slots: int, exclusive: bool
) -> str | None:
    """Why ``job`` (asking ``slots``, or the GPU whole) cannot join ``others``; None if it can.

    ``names`` is how the caller words the other holders (``job 'a'``).
    """
    if not others:
        return None
    if not sharing.shared:
        return f"held by {names}"
    if any(hold.exclusive for hold in others):
        return f"held by {names}, which takes GPUs whole (exclusive)"
    if exclusive:
        return f"held by {names}, and job '{job}' takes GPUs whole (exclusive)"
    used, capacity = slots_in_use(others, sharing), sharing.capacity
    if capacity is not None and used + slots > capacity:
        return f"held by {names}: {used} of {capacity} slots in use, {slots} asked"
    return None


def usage_text(holds: Sequence[Holding], sharing: Sharing) -> str:
    """``2/4 slots`` in a pool with slots, ``3 slots`` in an unlimited one, ``""`` if exclusive."""
    if not sharing.shared:
        return ""
    used = slots_in_use(holds, sharing)
    return f"{used}/{sharing.capacity} slots" if sharing.capacity else f"{used} slots"
