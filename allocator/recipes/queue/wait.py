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
:mod:`allocator.recipes.queue.order`'s.

:func:`wait_and_assign` is the one entry point (``set --wait`` and ``run
--wait``).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from allocator.control.gate import NotYourTurn, PlaceAround
from allocator.control.holder import priority_of
from allocator.errors import (
    AllocatorError,
    AmbiguousWrite,
    CasConflict,
    ConflictError,
    LeaseLost,
    PlacementRefused,
    StoreUnavailable,
)
from allocator.recipes.queue.faults import Outage, default_sigterm, exit_on_sigterm
from allocator.recipes.queue.order import blockers, decode_queue, wanted_ahead
from allocator.recipes.queue.preempt import try_preempt
from allocator.recipes.queue.share import read_share
from allocator.recipes.queue.view import QuotaLook, able_gpus, normal_fits
from allocator.records.codec import replace_struct
from allocator.records.holders import QueueEntry
from allocator.store import Compare, Delete, Op, Put, Read, Watch
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.placement.choose import Placement, Request
    from allocator.recipes.context import Context
    from allocator.records.types import Assignment
    from allocator.status.snapshots import HostSnapshot

T = TypeVar("T")

__all__ = [
    "QUEUE_TTL_S",
    "NotYourTurn",
    "PlaceAround",
    "WaitTimedOut",
    "queue_gate",
    "submitted_gate",
    "wait_and_assign",
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


class _Turn:
    """The gate of one request's takes (see ``Allocator.assign``).

    ``queued``: the request waits in the queue (``--wait``); one that does
    not is refused outright when a waiting request could use its GPUs (a
    self-service request never passes the queue).
    """

    def __init__(self, allocator: Context, request: Request, *, queued: bool = True) -> None:
        self.allocator = allocator
        self.host = request.host
        self.asked_gpus = not request.cpu
        self.by_count = request.count is not None
        self.queued = queued
        self.preemptible = request.preemptible
        self.me: str | None = None  # the entry's key once queued

    def __call__(self, state: HostSnapshot, placed: Placement) -> tuple[list[Compare], list[Op]]:

        layout, store = self.allocator.layout, self.allocator.store
        if self.asked_gpus and placed.mode == "cpu":
            raise NotYourTurn(f"no GPUs now ({placed.fallback_reason or 'unavailable'})")
        queue, arrivals = store.read_many(
            [
                Read(layout.host_queue(self.host), prefix=True),
                Read(layout.queue_arrivals(self.host)),
            ]
        )
        alive = state.agent is not None
        order = decode_queue(queue.items, self.allocator.on_bad_record, agent_alive=alive)
        compares = [Compare(layout.queue_arrivals(self.host), _revision(arrivals))]
        ops: list[Op] = []
        if self.me is not None:
            mine = next((w for w in order if w.key == self.me), None)
            if mine is None:
                raise LeaseLost("this request's queue entry is gone (its lease expired)")
            compares.append(Compare(mine.key, mine.revision))
            ops.append(Delete(mine.key))
        policy = self.allocator.require_policy().policy
        look = QuotaLook(self.allocator, policy)
        able = able_gpus(policy, state, self.allocator.clock())
        now = self.allocator.clock()
        fits = normal_fits(policy, state, now) if self.preemptible else None
        ahead = blockers(order, self.me, placed.gpus, able, look.over_quota, normal_fits=fits)
        if ahead:
            message = self._behind(ahead[0].entry)
            every = sorted({g for w in order for g in able(w.entry)})
            wanted = frozenset(
                wanted_ahead(order, self.me, every, able, look.over_quota, normal_fits=fits)
            )
            if self.by_count and wanted:
                raise PlaceAround(message, wanted)  # other GPUs may be free: try around them
            raise NotYourTurn(message)
        compares += look.compares()
        return compares, ops

    def _behind(self, first: QueueEntry) -> str:
        who = f"{first.job} ({first.holder}, {first.requested or '?'})"
        if self.queued:  # said after "waiting: " and "timed out waiting for ...: "
            return f"behind {who}"
        return f"a request waiting in the queue could use these GPUs: {who} (add --wait to queue)"


def _revision(listing: object) -> int:
    items = getattr(listing, "items", ())
    return int(items[0].mod_revision) if items else 0


def submitted_gate(allocator: Context, request: Request, entry_key: str) -> Gate:
    """The gate of a submitted job's take: its turn is ``entry_key``'s, which the take deletes."""
    turn = _Turn(allocator, request)
    turn.me = entry_key
    return turn


def queue_gate(allocator: Context, request: Request) -> Gate:
    """The gate of a self-service request that does not wait: refused while others queue."""

    host = request.host or allocator.default_host(allocator.require_policy().policy)
    return _Turn(allocator, replace_struct(request, host=host), queued=False)


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
    turn = _Turn(allocator, request)
    deadline = None if timeout is None else clock() + timeout
    first = _try(allocator, take, turn)
    if not isinstance(first, str):
        return first
    why, told = first, ""
    entry = _Entry(allocator, request, ttl)
    outage = Outage(clock)
    try:
        exit_on_sigterm()
        turn.me = entry.join()
        while True:
            if why and why != told:  # once on joining, then each time the reason changes
                on_wait(why)
                told = why
            left = None if deadline is None else deadline - clock()
            if left is not None and left <= 0:
                raise WaitTimedOut(
                    f"timed out waiting for {request.describe()} on {host}: {why}", why
                )
            entry.changes(min(RECHECK_S, left) if left is not None else RECHECK_S)
            found = _round(allocator, take, turn, entry, outage)
            if not isinstance(found, str):
                return found
            # Refused: GPUs a preemptible job holds may be this request's to take back.
            why = try_preempt(allocator, request, turn.me) or found
    finally:
        entry.leave()
        default_sigterm()


def _round(
    allocator: Context, take: Callable[[Gate], T], turn: _Turn, entry: _Entry, outage: Outage
) -> T | str:
    """One try of a queued waiter (rejoining first if its entry was lost); else why not."""
    try:
        if entry.lost:
            turn.me = entry.join()
    except StoreUnavailable as down:
        entry.lost = True  # the next join starts over: the lease it may have got is revoked
        return outage.ride(down)
    try:
        found = _try(allocator, take, turn)
    except AmbiguousWrite as down:
        # The take deletes this entry in its own transaction: while the entry
        # is there, the take did not land and the waiter may go on.
        if turn.me is None or allocator.store.get(turn.me) is None:
            raise
        return outage.ride(down)
    except StoreUnavailable as down:
        return outage.ride(down)
    outage.since = None
    return found


def _try(allocator: Context, take: Callable[[Gate], T], turn: _Turn) -> T | str:
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


class _Entry:
    """This waiter's queue entry, its lease kept alive by a thread, and its change watches."""

    def __init__(self, allocator: Context, request: Request, ttl: float) -> None:
        self.allocator, self.request, self.ttl = allocator, request, ttl
        self.lease: int | None = None
        self.key: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Watch | None = None

    def join(self) -> str:
        """Write the entry (new lease, new arrival) and return its key."""

        allocator, request = self.allocator, self.request
        layout, store = allocator.layout, allocator.store
        policy = allocator.require_policy().policy
        share = read_share(allocator, policy, allocator.holder)  # before the lease: a slow read
        self.leave()
        self.lost = False
        self._stop = threading.Event()
        self.lease = store.grant_lease(self.ttl)
        name = secrets.token_hex(8)
        self.key = layout.queue_entry(request.host, name)
        stamp = format_time(allocator.clock())
        entry = QueueEntry(
            job=request.job,
            host=request.host,
            holder=allocator.holder,
            since=stamp,
            gpus=request.gpus,
            count=request.count,
            slots=request.slots,
            priority=priority_of(
                policy,
                allocator.holder,
                allocator.holder_groups(policy),
                None if request.self_service else request.job,
            ),
            requested=request.describe(),
            self_service=request.self_service,
            fair_share=share.factor if share else None,
            usage=share.usage if share else None,
            preemptible=request.preemptible,
        )
        store.txn(
            [],
            [
                Put(self.key, entry.to_json(), lease=self.lease),
                Put(layout.queue_arrivals(request.host), stamp.encode()),
            ],
        )
        self._thread = threading.Thread(target=self._keep_alive, daemon=True, name="queue-lease")
        self._thread.start()
        return self.key

    def _keep_alive(self) -> None:
        lease, stop = self.lease, self._stop
        while lease is not None and not stop.wait(self.ttl / 3):
            try:
                self.allocator.store.refresh_lease(lease)
            except LeaseLost:
                self.lost = True
                return
            except AllocatorError:
                continue  # a store outage: try again; the lease outlives a short one

    def changes(self, timeout: float) -> None:
        """Return when something the turn depends on changed, or after ``timeout`` seconds.

        One watch on the store's root, filtered here: the host's keys, its
        queue and the quota counters (a backend's watch costs the same for
        one prefix as for three, and a short-lived waiter keeps one stream).
        """
        layout, host = self.allocator.layout, self.request.host
        prefixes = (layout.host(host), layout.host_queue(host), layout.holders, layout.policy)
        end = time.monotonic() + timeout
        try:
            if self._watch is None:
                store = self.allocator.store
                start = store.list(layout.policy, limit=1).revision + 1
                self._watch = store.watch(f"{layout.root}/", start)
                return  # a change before the watch began would go unseen: try once more
            while not self.lost and (left := end - time.monotonic()) > 0:
                if any(e.key.startswith(prefixes) for e in self._watch.next(left)):
                    return
        except AllocatorError:  # a broken or compacted watch: start a new one next time
            self._close_watches()
            time.sleep(max(0.0, min(end - time.monotonic(), 0.5)))

    def _close_watches(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def leave(self) -> None:
        """Remove the entry now (revoke its lease); no error if it is gone."""
        self._stop.set()
        self._close_watches()
        if self.lease is not None:
            lease, self.lease = self.lease, None
            with contextlib.suppress(AllocatorError):  # else the lease expires by itself
                self.allocator.store.revoke_lease(lease)
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._thread = None
