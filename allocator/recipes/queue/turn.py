"""Whose turn it is, as a take sees it: the gate of one host's queue, and of a gang's.

A :class:`Turn` is the gate ``Allocator.assign`` calls with the host's
state and the placement decided: it reads the host's queue and refuses
(:class:`~allocator.control.gate.NotYourTurn`) while a request ahead could
use the GPUs, else returns what the take compares and writes besides (the
host's arrivals key, this request's own entry, deleted, and the quota
counters the turn rule looked at). A :class:`Gang` is the same gate for a
job across hosts: one :class:`Turn` per host, each asked by
``Allocator.assign_across`` in its one transaction, so a gang takes every
share or none. The turn rule is :mod:`allocator.recipes.queue.order`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from allocator.control.gate import NotYourTurn, Passage, PlaceAround
from allocator.errors import LeaseLost
from allocator.recipes.queue.order import blockers, decode_queue, wanted_ahead
from allocator.recipes.queue.view import QuotaLook, able_gpus, normal_fits
from allocator.records.codec import replace_struct
from allocator.store import Compare, Delete, Op, Read

if TYPE_CHECKING:
    from allocator.placement.choose import Placement, Request
    from allocator.recipes.context import Context
    from allocator.records.holders import QueueEntry
    from allocator.status.snapshots import HostSnapshot

__all__ = ["Gang", "Turn"]


class Turn:
    """The gate of one request's takes on one host (see ``Allocator.assign``).

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

    def seat(self, keys: Mapping[str, str]) -> None:
        """This request's entry is now ``keys[host]`` (joined, or joined again)."""
        self.me = keys[self.host]

    def __call__(self, state: HostSnapshot, placed: Placement) -> Passage:
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
        return Passage(compares, ops)

    def _behind(self, first: QueueEntry) -> str:
        who = f"{first.job} ({first.holder}, {first.requested or '?'})"
        if self.queued:  # said after "waiting: " and "timed out waiting for ...: "
            return f"behind {who}"
        return f"a request waiting in the queue could use these GPUs: {who}"


class Gang:
    """The gate of a job across hosts that waits: one :class:`Turn` per host, all must pass.

    ``Allocator.assign_across`` asks it on every host within one
    transaction; a refusal on any host refuses the whole take (nothing is
    written), and says which host refused.
    """

    def __init__(self, allocator: Context, request: Request, hosts: Sequence[str]) -> None:
        self.turns = {h: Turn(allocator, replace_struct(request, host=h)) for h in hosts}

    def seat(self, keys: Mapping[str, str]) -> None:
        """This gang's entries are now ``keys`` (one per host)."""
        for turn in self.turns.values():
            turn.seat(keys)

    def __call__(self, state: HostSnapshot, placed: Placement) -> Passage:
        host = state.host
        try:
            return self.turns[host](state, placed)
        except PlaceAround as around:
            raise PlaceAround(f"on {host}: {around}", around.gpus) from None
        except NotYourTurn as refused:
            raise NotYourTurn(f"on {host}: {refused}") from None


def _revision(listing: object) -> int:
    items = getattr(listing, "items", ())
    return int(items[0].mod_revision) if items else 0
