"""A normal waiter at its turn takes GPUs back from preemptible holdings.

When a waiting normal request is refused (its GPUs held), it asks: would it
fit if some preemptible holdings of its host were gone
(:func:`~allocator.placement.preemption.choose_preempted`), and is it its
turn for the GPUs it would then get (no normal request ahead could use
them)? Then it marks those holdings preempted (``preempted_by``,
``preempted_at``) in one transaction that compares each of them, its own
queue entry and the host's arrivals key: decided from exactly what it read.
Each holding's holder (``run``, the agent's batch runner) sees the mark,
stops its command (SIGTERM, its grace, SIGKILL) and releases; the waiter
then takes the GPUs as it takes any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocator.errors import AllocatorError, CasConflict
from allocator.placement.preemption import Host, choose_preempted
from allocator.recipes.queue.order import blockers, decode_queue
from allocator.recipes.queue.view import QuotaLook, able_gpus, entry_asker
from allocator.records.codec import replace_struct
from allocator.records.types import Assignment
from allocator.store import Compare, Op, Put, Read
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.placement.choose import Request
    from allocator.recipes.context import Context

__all__ = ["preempt_for", "try_preempt"]


def try_preempt(allocator: Context, request: Request, me: str | None) -> str | None:
    """:func:`preempt_for`, any store error taken as "not now" (the next round decides again)."""
    if me is None or request.preemptible:
        return None
    try:
        return preempt_for(allocator, request, me)
    except AllocatorError:
        return None


def preempt_for(allocator: Context, request: Request, me: str) -> str | None:
    """Mark the preemptible holdings the waiter ``me`` needs; what it waits for then (one line).

    ``None`` when it takes nothing back: it fits already, would not fit
    anyway, is not at its turn, or its entry is gone.
    """
    store, layout = allocator.store, allocator.layout
    policy = allocator.require_policy().policy
    allocator.forget_views()
    state = allocator.host(request.host)
    if not any(a.preemptible for a in state.assignments.values()):
        return None  # the common case: one read, nothing to take back
    queue, arrivals = store.read_many(
        [
            Read(layout.host_queue(request.host), prefix=True),
            Read(layout.queue_arrivals(request.host)),
        ]
    )
    order = decode_queue(queue.items, allocator.on_bad_record, agent_alive=state.agent is not None)
    mine = next((w for w in order if w.key == me), None)
    look = QuotaLook(allocator, policy)
    if mine is None or look.over_quota(mine):
        return None
    now = allocator.clock()
    agent = state.agent
    host = Host(
        policy,
        now,
        agent.gpus if agent and agent.gpus else None,
        agent.unhealthy if agent else None,
    )
    asked = replace_struct(request, asker=entry_asker(policy, mine.entry))
    chosen = choose_preempted(asked, state.assignments, host)
    if chosen is None:
        return None
    able = able_gpus(policy, state, now)
    if blockers(order, me, chosen.placement.gpus, able, look.over_quota):
        return None  # a normal request ahead could use them: its turn first
    if chosen.jobs:
        arrived = arrivals.items[0].mod_revision if arrivals.items else 0
        held = [Compare(me, mine.revision), Compare(layout.queue_arrivals(request.host), arrived)]
        _mark(allocator, request, chosen.jobs, held)
    return "preempting " + ", ".join(chosen.jobs + chosen.stopping)


def _mark(allocator: Context, request: Request, jobs: tuple[str, ...], held: list[Compare]) -> None:
    """Write each holding marked preempted, under its own lease; all or none."""
    store, layout = allocator.store, allocator.layout
    keys = [layout.assignment(request.host, job) for job in jobs]
    compares, ops = list(held), list[Op]()
    stamp = format_time(allocator.clock())
    for listing in store.read_many([Read(k) for k in keys]):
        if not listing.items:
            raise CasConflict("a preempted holding is gone already", keys=tuple(keys))
        item = listing.items[0]
        current = Assignment.from_json(item.value)
        if not current.preemptible or current.preempted_by:
            raise CasConflict("a holding changed since it was read", keys=(item.key,))
        marked = replace_struct(current, preempted_by=request.job, preempted_at=stamp)
        compares.append(Compare(item.key, item.mod_revision))
        ops.append(Put(item.key, marked.to_json(), item.lease or None))
    store.txn(compares, ops)
