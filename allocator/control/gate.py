"""The wait queue's turn, as a write sees it: the gate ``Allocator.assign`` takes, and its refusals.

A gate is called with the host's state and the placement decided; it
returns what else the transaction compares and writes (and what the
change's history entry says of the queue), or raises. The
queue that makes gates (:mod:`allocator.recipes.queue_wait`) sits above
the write path; the write path knows only this much of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from allocator.errors import ConflictError

if TYPE_CHECKING:
    from typing import TypeAlias

    from allocator.placement.choose import Placement
    from allocator.status.snapshots import HostSnapshot
    from allocator.store import Compare, Op

    #: The wait queue's turn: (host state, placement) -> what the take adds.
    Gate: TypeAlias = Callable[[HostSnapshot, Placement], "Passage"]

__all__ = ["NotYourTurn", "Passage", "PlaceAround"]  # and the type ``Gate``, for annotations


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
