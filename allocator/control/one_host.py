"""One job on one host: one attempt of ``set`` and of ``release``, each one transaction.

An attempt reads what a change is decided from and writes what
:mod:`allocator.control.planner` decides, and nothing else: the
:class:`~allocator.control.write_cache.WriteView` (the one the client kept
from its last writes, or one read for the call), the clock, the holder's
standing and the quota counters the change moves. The plan is one
transaction that compares what it was decided from: the ``Assignment``
record a placement makes, its history entry, the counters and whatever the
wait queue's turn adds. A plan decided from a stale kept view fails its
compares, and the same answer brings the fresh state to decide again from;
the retries around an attempt are the client's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from msgspec import structs

from allocator.control.gate import gated_placement
from allocator.control.planner import (
    PlanContext,
    place_request,
    plan_assign,
    plan_release,
    with_extra,
)
from allocator.control.write_cache import Planned, WriteView, settle_view, view_reads
from allocator.errors import BadRecord, CasConflict, ConflictError, NotPermitted
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, RunHolder
from allocator.status.snapshots import no_policy_error
from allocator.store import Listing, Read, bad_key_records

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.control.writer import Writer
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy

__all__ = ["Extra", "assign_once", "release_once", "view_reads_for"]

#: What a ``set`` may carry besides the request: an ad-hoc command, the holding
#: process (its record and store lease), the wait queue's turn.
Extra = tuple[tuple[str, ...] | None, tuple[RunHolder, int] | None, "Gate | None"]
T = TypeVar("T")


def assign_once(
    writer: Writer, asked: Request, reason: str, extra: Extra, *, first: bool
) -> tuple[Assignment, Placement]:
    """One attempt of ``asked`` (its host named): from the kept view if there is one, else one read.

    A view kept from earlier calls that turns out stale costs no attempt:
    its failed write brought back the fresh state, and the attempt goes
    again from that. A write decided from state read for this call (on a
    later attempt, what the lost race brought back) that loses is a lost race.
    """
    host, job = asked.host, asked.job
    view = writer.kept_views().get(host, job)
    fresh = view is None or not first
    if view is None:
        view = _read_view(writer, host, job)
    while True:
        try:
            placed, planned = _plan_set(writer, view, asked, reason, extra)
        except (ConflictError, NotPermitted):
            if fresh:
                raise
            # A refusal decided from a kept view is only a guess too: the holder it
            # names may be gone (released by another client, or its lease expired).
            view, fresh = _read_view(writer, host, job), True
            continue
        outcome = writer.write(planned, view_reads_for(writer.layout, host, job))
        if outcome.succeeded:
            writer.kept_views().keep(planned.after(outcome.revision))
            return placed
        view = _settle(writer, host, job, outcome.reads)
        if fresh:
            raise CasConflict("a compared key changed", keys=outcome.changed)
        fresh = True


def release_once(
    writer: Writer,
    host: str,
    job: str,
    reason: str,
    conditions: tuple[int | None, tuple[int, float] | None],
) -> Assignment | BadRecord:
    """One attempt of a release, decided from a fresh read (see :func:`plan_release`)."""
    view = _read_view(writer, host, job)
    policy = view.policy.policy if view.policy is not None else None
    context = _context(writer, policy)
    held = view.host.assignments.get(job)
    if held is not None and held.charged and policy is not None:
        context = _with_counters(writer, context, held.charged, adding=())
    current, planned = plan_release(view, job, reason, conditions, context)
    # A release is decided from fresh state, so a plain transaction: a lost
    # compare is a lost race, and the retry reads again.
    revision = writer.txn(planned.compares, planned.ops)
    writer.kept_views().keep(planned.after(revision))
    return current


def _plan_set(
    writer: Writer, view: WriteView, asked: Request, reason: str, extra: Extra
) -> tuple[tuple[Assignment, Placement], Planned]:
    """Place ``asked`` on ``view``, take the queue's turn, read the counters, plan the write."""
    command, held_by, gate = extra
    if view.policy is None:
        raise no_policy_error(writer.store.url)
    held = (command, held_by)
    context = _context(writer, view.policy.policy)

    def place_it(around: Mapping[int, str]) -> tuple[Request, Placement]:
        return place_request(view, asked, held, context, around)

    (request, decision), gated = gated_placement(
        place_it, gate, view.host, lambda placed: placed[1]
    )
    before = view.host.assignments.get(request.job)
    subjects = {*context.standing.charged, *(before.charged if before is not None else ())}

    def plan(context: PlanContext) -> tuple[Assignment, Planned]:
        return plan_assign(view, request, decision, reason, held, context, passed=gated.passed)

    if subjects:
        charge = f"{view.host.host}/{request.job}"  # the name its counters know it by
        assignment, planned = _plan_charged(writer, plan, context, subjects, charge)
    else:
        assignment, planned = plan(context)
    return (assignment, decision), with_extra(planned, gated.compares, gated.ops)


def _plan_charged(
    writer: Writer,
    plan: Callable[[PlanContext], T],
    context: PlanContext,
    subjects: Collection[str],
    charge: str,
) -> T:
    """``plan`` from the counters of ``subjects``; over a quota, once more without vanished charges.

    An assignment bound to a lease goes when its lease expires, and no one
    gives back its charge: the counters may list charges that are gone.
    """
    # Here, not at the top: a `set` where no one is charged never loads the quota code.
    from allocator.control.quotas import OverQuota, read_gone

    adding = context.standing.charged
    context = _with_counters(writer, context, subjects, adding)
    try:
        return plan(context)
    except OverQuota:
        store, layout = writer.store, writer.layout
        gone = read_gone(store, layout, context.counters, adding, {charge})
        if not gone:
            raise
        return plan(structs.replace(context, gone=gone))


def _context(writer: Writer, policy: Policy | None) -> PlanContext:
    """Who writes, their standing under ``policy`` and the time: read once per plan."""
    standing = writer.standing(policy)
    return PlanContext(writer.layout, writer.actor, writer.clock(), standing)


def _with_counters(
    writer: Writer, context: PlanContext, subjects: Iterable[str], adding: Collection[str]
) -> PlanContext:
    """``context`` with the quota counters of ``subjects`` (one read).

    A damaged counter the change only gives back to is reported here and left
    as it is; one it would charge refuses the plan.
    """
    # Here, not at the top: a `set` where no one is charged never loads the quota code.
    from allocator.control.quotas import read_counters, report_damaged

    counters = read_counters(writer.store, writer.layout, subjects)
    report_damaged(counters, set(subjects) - set(adding), writer.on_bad_record)
    return structs.replace(context, counters=counters)


def _read_view(writer: Writer, host: str, job: str) -> WriteView:
    """The state a change of ``job`` on ``host`` is decided from: one request."""
    reads = view_reads(writer.layout, host, job, policy_text=True)
    return _settle(writer, host, job, writer.store.read_many(reads))


def _settle(writer: Writer, host: str, job: str, found: Sequence[Listing]) -> WriteView:
    """The view ``found`` (a view's reads) holds, kept for the next write; bad keys noted."""
    kept = writer.kept_views()
    for listing in found:
        for bad in bad_key_records(listing):
            writer.on_bad_record(bad)
    view = settle_view(
        writer.store, writer.layout, host, job, found, kept.policy, writer.on_bad_record
    )
    kept.keep(view)
    return view


def view_reads_for(layout: KeyLayout, host: str, job: str) -> list[Read]:
    """What a failed change brings back: the view's reads, the policy's revision only."""
    return view_reads(layout, host, job, policy_text=False)
