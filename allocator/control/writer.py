"""What one attempt of a write asks of the client making it, named in one place.

:class:`Writes` is the least a transaction needs: the store and its keys,
the clock, who writes, where damaged records go, and the size-checked
transaction. ``policy apply`` and the quota counters ask for no more.
:class:`Writer` adds what an assignment change is decided from and checked
against: the holder's standing (a frozen record the checks read) and the
views the client keeps between writes. The :class:`~allocator.control.client.Allocator` is both; the
attempts take these instead of it, so none of them imports the client
that calls them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from allocator.control.owners import Standing
    from allocator.control.write_cache import Planned, ViewCache, WriteView
    from allocator.errors import BadRecord, RequestError
    from allocator.policy import Policy
    from allocator.records.keys import KeyLayout
    from allocator.status.snapshots import HostSnapshot, PolicySnapshot
    from allocator.store import Compare, Listing, Op, Read, Store, TxnOutcome

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
    """What an assignment change is decided from: the holder's standing, the kept views."""

    def standing(self, policy: Policy | None) -> Standing:
        """The holder's standing under ``policy``: who, its groups, what it is charged to."""
        ...

    def generation_value(self, stamp: str | None = None) -> bytes:
        """The value a write puts in the generation keys it bumps."""
        ...

    def no_policy_error(self) -> RequestError:
        """What a write that needs a policy raises in a store that has none."""
        ...

    def known_policy(self) -> Policy | None:
        """The kept whole policy, else the applied one read now."""
        ...

    def require_policy(self) -> PolicySnapshot:
        """The applied policy, or a ``RequestError`` telling how to apply one."""
        ...

    def default_host(self, policy: Policy | None) -> str:
        """The only host in the policy, else this machine's host name."""
        ...

    def host(self, host: str) -> HostSnapshot:
        """Everything stored under ``host``, in one prefix read."""
        ...

    def kept_views(self) -> ViewCache:
        """What the last writes saw."""
        ...

    def read_view(self, host: str, job: str) -> WriteView:
        """The state a change of ``job`` on ``host`` is decided from: one request."""
        ...

    def settle(self, host: str, job: str, found: Sequence[Listing]) -> WriteView:
        """The view ``found`` holds, kept for the next write."""
        ...

    def write(self, planned: Planned, reads: list[Read]) -> TxnOutcome:
        """``store.txn_or_read``, refusing anything larger than every backend accepts."""
        ...
