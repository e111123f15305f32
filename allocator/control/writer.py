"""What one attempt of a write asks of the client making it, named in one place.

:class:`Writes` is the least a transaction needs: the store and its keys,
the clock, who writes, where damaged records go, and the size-checked
transaction. ``policy apply`` and the quota counters ask for no more.
:class:`Writer` adds what an assignment change is decided with: the holder's
standing (a frozen record the checks read), the policy and views the client
keeps between writes, and the write that brings the fresh state back when it
fails; anything else an attempt reads, it reads from the store itself.
The :class:`~allocator.control.client.Allocator` is both; the
attempts take these instead of it, so none of them imports the client
that calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from allocator.control.owners import Standing
    from allocator.control.write_cache import Planned, ViewCache
    from allocator.errors import BadRecord
    from allocator.policy import Policy
    from allocator.records.keys import KeyLayout
    from allocator.store import Compare, Op, Read, Store, TxnOutcome

__all__ = ["Writer", "Writes"]


class Writes(Protocol):
    """The store, its keys, the clock and who writes: enough for one transaction."""

    @property
    def store(self) -> Store: ...
    @property
    def layout(self) -> KeyLayout: ...
    @property
    def clock(self) -> Callable[[], datetime]: ...
    @property
    def actor(self) -> str: ...
    @property
    def on_bad_record(self) -> Callable[[BadRecord], None]: ...

    def txn(self, compares: list[Compare], ops: list[Op]) -> int:
        """``store.txn``, refusing anything larger than every backend accepts."""
        ...


class Writer(Writes, Protocol):
    """What an assignment change is decided with: the holder's standing, the kept views."""

    def standing(self, policy: Policy | None) -> Standing:
        """The holder's standing under ``policy``: who, its groups, what it is charged to."""
        ...

    def known_policy(self) -> Policy | None:
        """The kept whole policy, else the applied one read now."""
        ...

    def kept_views(self) -> ViewCache:
        """What the last writes saw."""
        ...

    def write(self, planned: Planned, reads: list[Read]) -> TxnOutcome:
        """``store.txn_or_read``, refusing anything larger than every backend accepts."""
        ...
