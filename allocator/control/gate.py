"""The wait queue's turn, as a write sees it: the gate ``Allocator.assign`` takes, and its refusals.

A gate is called with the host's state and the placement decided; it
returns what else the transaction compares and writes, or raises. The
queue that makes gates (:mod:`allocator.recipes.queue.turn`) sits above
the write path; the write path knows only this much of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from allocator.errors import ConflictError, PlacementRefused

if TYPE_CHECKING:
    from typing import TypeAlias

    from allocator.placement.choose import Placement
    from allocator.status.snapshots import HostSnapshot
    from allocator.store import Compare, Op

    #: The wait queue's turn: (host state, placement) -> (compares, writes) to add.
    Gate: TypeAlias = Callable[[HostSnapshot, Placement], tuple[list[Compare], list[Op]]]

__all__ = ["NotYourTurn", "PlaceAround", "gated_placement"]  # and ``Gate``, for annotations


class NotYourTurn(ConflictError):
    """A request ahead of this one could use the GPUs it would take."""


class PlaceAround(NotYourTurn):
    """A ``count=N`` take landed on GPUs a request ahead could use: place it around ``gpus``."""

    def __init__(self, message: str, gpus: frozenset[int]) -> None:
        super().__init__(message)
        self.gpus = gpus


def gated_placement(
    place_it: Callable[[Mapping[int, str]], Placement], gate: Gate | None, state: HostSnapshot
) -> tuple[Placement, tuple[list[Compare], list[Op]]]:
    """The placement and the wait queue's extra compares and writes (none without a gate).

    ``place_it(around)`` places the request as if the GPUs of ``around`` were
    unavailable. A ``count=N`` placed on GPUs a request ahead could use is
    placed once more around them: other GPUs may be free that no one ahead
    could use. Still blocked: not its turn.
    """
    decision = place_it({})
    if gate is None:
        return decision, ([], [])
    try:
        return decision, gate(state, decision)
    except PlaceAround as around:
        wanted = dict.fromkeys(around.gpus, "wanted by a request ahead in the queue")
        try:
            again = place_it(wanted)
            return again, gate(state, again)
        except (PlacementRefused, PlaceAround):
            raise NotYourTurn(str(around)) from None
