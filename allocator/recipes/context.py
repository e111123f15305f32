"""The narrow write context every recipe takes: the few calls recipes make on a client.

Recipes sit above the write path and use it as kazoo's recipes use a client:
through its public calls only. Naming them here, in one place, keeps the
recipes off the client's internals and its module; the
:class:`~allocator.control.client.Allocator` is a ``Context``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from allocator.control.across_hosts import GroupResult
    from allocator.control.gate import Gate
    from allocator.errors import BadRecord
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy
    from allocator.records.keys import KeyLayout
    from allocator.records.types import Assignment, RunHolder
    from allocator.status.snapshots import HostSnapshot, PolicySnapshot
    from allocator.store import Store

__all__ = ["Context"]


class Context(Protocol):
    """Reads, the writes, and who asks: what the self-service recipes call."""

    @property
    def store(self) -> Store: ...
    @property
    def layout(self) -> KeyLayout: ...
    @property
    def clock(self) -> Callable[[], datetime]: ...
    @property
    def on_bad_record(self) -> Callable[[BadRecord], None]: ...
    @property
    def holder(self) -> str: ...

    def holder_groups(self, policy: Policy) -> tuple[str, ...]:
        """The holder's unix groups, looked up only when ``policy`` names one."""
        ...

    def policy(self) -> PolicySnapshot | None:
        """The applied policy, or ``None`` if none was applied yet."""
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

    def forget_views(self) -> None:
        """Decide the next write from a fresh read."""
        ...

    def assign(
        self,
        request: Request,
        *,
        reason: str = "",
        command: tuple[str, ...] | None = None,
        held_by: tuple[RunHolder, int] | None = None,
        gate: Gate | None = None,
    ) -> tuple[Assignment, Placement]:
        """Check ``request`` against policy and current state, then write it atomically."""
        ...

    def assign_across(
        self,
        request: Request,
        hosts: Sequence[str],
        *,
        reason: str = "",
        command: tuple[str, ...] | None = None,
        gate: Gate | None = None,
    ) -> GroupResult:
        """Assign ``request`` on every one of ``hosts`` as one job: one transaction, all or none."""
        ...

    def release(
        self,
        host: str,
        job: str,
        *,
        reason: str = "",
        if_revision: int | None = None,
        ended: tuple[int, float] | None = None,
    ) -> Assignment | BadRecord:
        """Remove ``job``'s assignment on ``host``; return what was removed."""
        ...
