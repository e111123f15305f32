"""The wait queue's turn, as a write sees it: the gate ``Allocator.assign`` takes, and its refusals.

A gate is called with the host's state and the placement decided; it
returns what else the transaction compares and writes, or raises. The
queue that makes gates (:mod:`allocator.recipes.queue_wait`) sits above
the write path; the write path knows only this much of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from allocator.errors import ConflictError

if TYPE_CHECKING:
    from typing import TypeAlias

    from allocator.placement.choose import Placement
    from allocator.status.snapshots import HostSnapshot
    from allocator.store import Compare, Op

    #: The wait queue's turn: (host state, placement) -> (compares, writes) to add.
    Gate: TypeAlias = Callable[[HostSnapshot, Placement], tuple[list[Compare], list[Op]]]

__all__ = ["NotYourTurn", "PlaceAround"]  # and the type ``Gate``, for annotations


class NotYourTurn(ConflictError):
    """A request ahead of this one could use the GPUs it would take."""


class PlaceAround(NotYourTurn):
    """A ``count=N`` take landed on GPUs a request ahead could use: place it around ``gpus``."""

    def __init__(self, message: str, gpus: frozenset[int]) -> None:
        super().__init__(message)
        self.gpus = gpus
