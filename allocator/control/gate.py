"""The wait queue's turn, as a write sees it: the gate ``Allocator.assign`` takes, and its refusals.

A gate is called with the host's state and the placement decided; it
returns what else the transaction compares and writes (and what the
change's history entry says of the queue), or raises. The
queue that makes gates (:mod:`allocator.recipes.queue.turn`) sits above
the write path; the write path knows only this much of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from allocator.errors import ConflictError, PlacementRefused

if TYPE_CHECKING:
    from typing import TypeAlias

    from allocator.placement.choose import Placement
    from allocator.status.snapshots import HostSnapshot
    from allocator.store import Compare, Op

    #: The wait queue's turn: (host state, placement) -> what the take adds.
    Gate: TypeAlias = Callable[[HostSnapshot, Placement], "Passage"]

#: What a placement function returns (a placement, or a placement with its request).
P = TypeVar("P")

__all__ = ["NotYourTurn", "Passage", "PlaceAround", "gated_placement"]  # and ``Gate``


class Passage(NamedTuple):
    """What a gate adds to a take: compares and writes, and a remark for its history entry.

    ``passed`` is said only by an operator's direct ``set`` that took GPUs
    waiting requests could use (``passed 2 waiting request(s) on node1: ...``).
    """

    compares: list[Compare]
    ops: list[Op]
    passed: str = ""


class NotYourTurn(ConflictError):
    """A request ahead of this one could use the GPUs it would take."""


class PlaceAround(NotYourTurn):
    """A ``count=N`` take landed on GPUs a request ahead could use: place it around ``gpus``."""

    def __init__(self, message: str, gpus: frozenset[int]) -> None:
        super().__init__(message)
        self.gpus = gpus


def gated_placement(
    place_it: Callable[[Mapping[int, str]], P],
    gate: Gate | None,
    state: HostSnapshot,
    decision: Callable[[P], Placement],
) -> tuple[P, Passage]:
    """The placement and what the wait queue adds to the take (nothing without a gate).

    ``place_it(around)`` places the request as if the GPUs of ``around`` were
    unavailable; ``decision`` finds the :class:`Placement` in what it returns.
    A ``count=N`` placed on GPUs a request ahead could use is placed once
    more around them: other GPUs may be free that no one ahead could use.
    Still blocked: not its turn.
    """
    placed = place_it({})
    if gate is None:
        return placed, Passage([], [])
    try:
        return placed, gate(state, decision(placed))
    except PlaceAround as around:
        wanted = dict.fromkeys(around.gpus, "wanted by a request ahead in the queue")
        try:
            again = place_it(wanted)
            return again, gate(state, decision(again))
        except (PlacementRefused, PlaceAround):
            raise NotYourTurn(str(around)) from None
