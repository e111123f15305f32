"""Waiting in the queue for GPUs, and taking them the moment it is this request's turn.

No scheduler: each waiter is its own. It first tries to take the GPUs
outright (allowed only when no waiting request could use them); refused,
it writes its entry under the host's queue prefix with a lease it keeps
alive (a waiter that dies leaves the queue when the lease expires), then
watches the host's keys, the host's queue and the quota counters, and on
every change tries again. A take is one transaction: the assignment (with
every compare ``set`` makes), the quota counters, the deletion of its own
entry (compared, so a lapsed lease cannot be taken over), and the host's
arrivals key (compared, so a request that joined meanwhile, maybe ahead
of it, makes it decide again). The turn rule is
:mod:`allocator.recipes.queue.order`'s, the gate :mod:`allocator.recipes.queue.turn`'s.

A job across hosts (a gang) waits the same way in the queue of every one
of its hosts (its entries: :mod:`allocator.recipes.queue.ticket`), and
takes every share in one transaction that passes its turn on every host,
or takes nothing and waits on.

:func:`wait_and_assign` (``set --wait``, ``run --wait``) and
:func:`wait_and_assign_across` (``set host=a,b --wait``) are the entry points.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from allocator.control.gate import NotYourTurn, PlaceAround
from allocator.errors import (
    AmbiguousWrite,
    CasConflict,
    ConflictError,
    LeaseLost,
    PermissionDenied,
    PlacementRefused,
    RequestError,
    StoreUnavailable,
)
from allocator.recipes.queue.faults import Outage, default_sigterm, exit_on_sigterm
from allocator.recipes.queue.preempt import try_preempt
from allocator.recipes.queue.ticket import Ticket
from allocator.recipes.queue.tombstone import Cancelled, cancelled_by
from allocator.recipes.queue.turn import Gang, Turn
from allocator.records.codec import replace_struct

if TYPE_CHECKING:
    from allocator.control.across_hosts import GroupResult
    from allocator.control.gate import Gate
    from allocator.placement.choose import Placement, Request
    from allocator.recipes.context import Context
    from allocator.records.types import Assignment

T = TypeVar("T")

__all__ = [
    "QUEUE_TTL_S",
    "NotYourTurn",
    "PlaceAround",
    "WaitTimedOut",
    "queue_gate",
    "submitted_gate",
    "wait_and_assign",
    "wait_and_assign_across",
    "wait_in_queue",
]

#: The lease of a queue entry: a dead waiter leaves the queue within this.
QUEUE_TTL_S = 10.0
#: The longest a waiter goes without trying again when it saw no change.
RECHECK_S = 2.0


class WaitTimedOut(ConflictError):
    """``--wait=DURATION`` passed without the GPUs (exit 3, naming what it waited for)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


def submitted_gate(allocator: Context, request: Request, entry_key: str) -> Gate:
    """The gate of a submitted job's take: its turn is ``entry_key``'s, which the take deletes."""
    turn = Turn(allocator, request)
    turn.me = entry_key
    return turn


def queue_gate(allocator: Context, request: Request) -> Gate:
    """The gate of a self-service request that does not wait: refused while others queue."""

    host = request.host or allocator.default_host(allocator.require_policy().policy)
    return Turn(allocator, replace_struct(request, host=host), queued=False)


def wait_and_assign(
    allocator: Context,
    request: Request,
    *,
    reason: str = "",
    command: tuple[str, ...] | None = None,
    timeout: float | None = None,
    on_wait: Callable[[str], None] = lambda _why: None,
    ttl: float = QUEUE_TTL_S,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Assignment, Placement]:
    """``set --wait``: :func:`wait_in_queue` with ``Allocator.assign`` as the take."""

    def take(gate: Gate) -> tuple[Assignment, Placement]:
        return allocator.assign(request, reason=reason, command=command, gate=gate)

    return wait_in_queue(
        allocator, request, take, timeout=timeout, on_wait=on_wait, ttl=ttl, clock=clock
    )


def wait_in_queue(
    allocator: Context,
    request: Request,
    take: Callable[[Gate], T],
    *,
    timeout: float | None = None,
    on_wait: Callable[[str], None] = lambda _why: None,
    ttl: float = QUEUE_TTL_S,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Take ``request``'s GPUs now if it may, else wait in the queue until it may.

    ``timeout`` (seconds; ``None``: forever) ends the wait with
    :class:`WaitTimedOut`; ``on_wait`` hears why it waits whenever that
    changes. The entry is removed however this returns or raises (Ctrl-C
    included); a process killed outright leaves it to its lease.
    ``take(gate)`` writes the assignment, handing ``gate`` to
    :meth:`Allocator.assign` (``set``: a plain assign; ``run``: its leased
    holding); a refusal it raises (``ConflictError``) means: wait.
    """
    host = request.host or allocator.default_host(allocator.require_policy().policy)
    request = replace_struct(request, host=host)
    ticket = Ticket(allocator, request, (host,), ttl)
    waiter = _Waiter(allocator, ticket, Turn(allocator, request), host)
    return waiter.wait(take, timeout, on_wait, clock)


def wait_and_assign_across(
    allocator: Context,
    request: Request,
    hosts: Sequence[str],
    *,
    reason: str = "",
    command: tuple[str, ...] | None = None,
    timeout: float | None = None,
    on_wait: Callable[[str], None] = lambda _why: None,
    ttl: float = QUEUE_TTL_S,
    clock: Callable[[], float] = time.monotonic,
) -> GroupResult:
    """``set host=a,b --wait``: wait in every host's queue, then take every share at once.

    The gang's entries (one per host) are written in one transaction; each
    try is ``Allocator.assign_across`` with a :class:`Gang` gate, one
    transaction that takes every share only while it is the gang's turn on
    every host, else nothing. ``timeout``, ``on_wait``: as :func:`wait_in_queue`.
    """
    from allocator.control.across_hosts import MAX_GANG_HOSTS, check_hosts

    nodes = check_hosts(request.job, hosts)
    if len(nodes) > MAX_GANG_HOSTS:
        raise RequestError(
            f"job {request.job!r}: --wait across hosts spans at most {MAX_GANG_HOSTS} hosts "
            "(its turn on each host is checked in the same transaction)"
        )

    def take(gate: Gate) -> GroupResult:
        return allocator.assign_across(request, nodes, reason=reason, command=command, gate=gate)

    ticket = Ticket(allocator, request, nodes, ttl)
    waiter = _Waiter(allocator, ticket, Gang(allocator, request, nodes), ",".join(nodes))
    return waiter.wait(take, timeout, on_wait, clock)


class _Waiter:
    """One waiter's loop: try, join the queue(s), and try again on every change."""

    def __init__(self, allocator: Context, ticket: Ticket, turn: Turn | Gang, where: str) -> None:
        self.allocator, self.ticket, self.turn, self.where = allocator, ticket, turn, where

    def wait(
        self,
        take: Callable[[Gate], T],
        timeout: float | None,
        on_wait: Callable[[str], None],
        clock: Callable[[], float],
    ) -> T:
        """Take now if it may, else join and wait until it may (see :func:`wait_in_queue`)."""
        allocator, ticket, turn = self.allocator, self.ticket, self.turn
        deadline = None if timeout is None else clock() + timeout
        first = _try(allocator, take, turn)
        if not isinstance(first, str):
            return first
        why, told = first, ""
        outage = Outage(clock)
        try:
            exit_on_sigterm()
            turn.seat(ticket.join())
            while True:
                if why and why != told:  # once on joining, then each time the reason changes
                    on_wait(why)
                    told = why
                left = None if deadline is None else deadline - clock()
                if left is not None and left <= 0:
                    what = ticket.request.describe()
                    raise WaitTimedOut(f"timed out waiting for {what} on {self.where}: {why}", why)
                ticket.changes(min(RECHECK_S, left) if left is not None else RECHECK_S)
                if ticket.maybe_removed:  # a cancel deletes the entries: read its tombstone
                    ticket.maybe_removed = False
                    for key in ticket.keys.values():  # the entries as last joined
                        _stop_if_cancelled(allocator, key)
                found = _round(allocator, take, turn, ticket, outage)
                if not isinstance(found, str):
                    return found
                # Refused: GPUs a preemptible job holds may be this request's to take back
                # (one host's waiter; a gang waits for them to end).
                mine = turn.me if isinstance(turn, Turn) else None
                why = try_preempt(allocator, ticket.request, mine) or found
        finally:
            ticket.leave()
            default_sigterm()


def _stop_if_cancelled(allocator: Context, key: str | None) -> None:
    """``Cancelled`` if ``allocator cancel`` removed this waiter's entry (not a lapsed lease)."""
    if key is None:
        return
    try:
        by = cancelled_by(allocator, key)
    except StoreUnavailable:
        return  # the round that follows rides the outage
    except PermissionDenied:
        return  # a role that may not read tombstones: only a lapsed lease is told apart
    if by is not None:
        raise Cancelled(f"cancelled by {by or 'someone'}")


def _round(
    allocator: Context,
    take: Callable[[Gate], T],
    turn: Turn | Gang,
    ticket: Ticket,
    outage: Outage,
) -> T | str:
    """One try of a queued waiter (rejoining first if its entries were lost); else why not."""
    if (waits := _settle_cut(allocator, outage)) is not None:
        return waits  # a cut-off take still unread: nothing else is taken meanwhile
    try:
        if ticket.lost:
            turn.seat(ticket.join())
    except StoreUnavailable as down:
        ticket.lost = True  # the next join starts over: the lease it may have got is revoked
        return outage.ride(down)
    try:
        found = _try(allocator, take, turn)
    except AmbiguousWrite as down:
        outage.cut = (next(iter(ticket.keys.values()), None), down)
        return _settle_cut(allocator, outage) or outage.ride(down)
    except StoreUnavailable as down:
        return outage.ride(down)
    outage.since = None
    return found


def _settle_cut(allocator: Context, outage: Outage) -> str | None:
    """``None`` once no take the store cut off may have landed unseen; else why it waits.

    The take deletes the entries in its own transaction: while one is
    there, the take did not land and the waiter may go on. Gone, it may
    have landed: its ``AmbiguousWrite`` is raised. Unreadable (the store
    still away), the cut is kept and read again before any other take, so
    a take never lands twice.
    """
    if outage.cut is None:
        return None
    mine, down = outage.cut
    try:
        gone = mine is None or allocator.store.get(mine) is None
    except StoreUnavailable as away:
        try:
            return outage.ride(away)
        except StoreUnavailable:
            raise down from None  # away too long: the take may have landed, and it says so
    if gone:
        raise down
    outage.cut = None
    return None


def _try(allocator: Context, take: Callable[[Gate], T], turn: Turn | Gang) -> T | str:
    """What the take returned if it succeeded, else why not (one line)."""
    allocator.forget_views()
    try:
        return take(turn)
    except (PlacementRefused, NotYourTurn, CasConflict) as refused:
        return str(refused)
    except LeaseLost as lost:
        return str(lost)
    except ConflictError as refused:  # over quota
        return str(refused)
