"""One job on one host: one attempt of ``set`` and of ``release``, each one transaction.

A change is decided from a :class:`~allocator.control.write_cache.WriteView`
(the one the :class:`~allocator.control.client.Allocator` kept from its last
writes, or one read for the call) and planned here: the ``Assignment``
record a placement makes, its history entry, the quota counters it moves
and whatever the wait queue's turn adds, all in one transaction that
compares what it was decided from. A plan decided from a stale kept view
fails its compares, and the same answer brings the fresh state to decide
again from; the retries around an attempt are the client's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from allocator.control.gate import NotYourTurn, PlaceAround
from allocator.control.holder import asker_of
from allocator.control.write_cache import Planned, WriteView, plan_change, view_reads
from allocator.errors import (
    BadRecord,
    CasConflict,
    ConflictError,
    NotPermitted,
    PlacementRefused,
    RequestError,
)
from allocator.history.entries import change_entry, release_entry
from allocator.records.codec import replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, RunHolder
from allocator.status.snapshots import job_not_found
from allocator.store import Compare, Delete, Op, Put, Read
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.control.gate import Gate
    from allocator.control.writer import Writer
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy
    from allocator.status.snapshots import HostSnapshot, PolicySnapshot

__all__ = [
    "Extra",
    "assign_once",
    "check_adhoc_command",
    "plan_assign",
    "plan_release",
    "release_once",
    "view_reads_for",
    "with_extra",
]

#: What a ``set`` may carry besides the request: an ad-hoc command, the holding
#: process (its record and store lease), the wait queue's turn.
Extra = tuple[tuple[str, ...] | None, tuple[RunHolder, int] | None, "Gate | None"]


def assign_once(
    writer: Writer, asked: Request, reason: str, extra: Extra, *, first: bool
) -> tuple[Assignment, Placement]:
    """One attempt: decided from the kept view if there is one, else from one fresh read.

    A view kept from earlier calls that turns out stale costs no attempt:
    its failed write brought back the fresh state, and the attempt goes
    again from that. A write decided from state read for this call (on a
    later attempt, what the lost race brought back) that loses is a lost race.
    """
    host = asked.host or writer.default_host(writer.known_policy())
    view = writer.kept_views().get(host, asked.job)
    fresh = view is None or not first
    if view is None:
        view = writer.read_view(host, asked.job)
    while True:
        # replace() would validate the request again; it was when it was made.
        request = asked if asked.host == host else replace_struct(asked, host=host)
        try:
            placed, planned = plan_assign(writer, view, request, reason, extra)
        except (ConflictError, NotPermitted):
            if fresh:
                raise
            # A refusal decided from a kept view is only a guess too: the holder it
            # names may be gone (released by another client, or its lease expired).
            view, fresh = writer.read_view(host, asked.job), True
            continue
        outcome = writer.write(planned, view_reads_for(writer.layout, host, asked.job))
        if outcome.succeeded:
            writer.kept_views().keep(planned.after(outcome.revision))
            return placed
        view = writer.settle(host, asked.job, outcome.reads)
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
    view = writer.read_view(host, job)
    current, planned = plan_release(writer, view, job, reason, conditions)
    # A release is decided from fresh state, so a plain transaction: a lost
    # compare is a lost race, and the retry reads again.
    revision = writer.txn(planned.compares, planned.ops)
    writer.kept_views().keep(planned.after(revision))
    return current


def plan_assign(
    writer: Writer, view: WriteView, request: Request, reason: str, extra: Extra
) -> tuple[tuple[Assignment, Placement], Planned]:
    """Place ``request`` on ``view``'s host and plan its write: (record, placement), the plan.

    Raises what placement raises (a conflict naming the holder, a refusal),
    and ``OverQuota`` when a quota would be exceeded.
    """
    from allocator.placement.choose import place

    command, held_by, gate = extra
    snapshot = view.policy
    if snapshot is None:
        raise writer.no_policy_error()
    if command is not None:
        check_adhoc_command(snapshot.policy, request.job)
    state, now = view.host, writer.clock()
    request = _with_asker(writer, snapshot.policy, request)
    if held_by is not None and (request.job in state.assignments or view.index.hosts):
        raise ConflictError(
            f"job {request.job!r} already holds an assignment: "
            "`allocator run` takes GPUs for a job that holds none (pick another job=)"
        )
    # Whose it is comes before whether it fits: a refusal names the holder, not a GPU.
    writer.standing(snapshot.policy).check_owners([state.assignments.get(request.job)])
    agent = state.agent

    def place_it(around: Mapping[int, str]) -> Placement:
        return place(
            snapshot.policy,
            request,
            state.assignments,
            now,
            inventory=agent.gpus if agent and agent.gpus else None,
            unhealthy={**(agent.unhealthy if agent else {}), **around},
        )

    decision, gated = _gated(place_it, gate, state)
    stamp = format_time(now)
    assignment = _new_assignment(
        writer,
        snapshot,
        request,
        decision,
        host=state.host,
        stamp=stamp,
        reason=reason,
        command=command,
        held_by=held_by,
    )
    lease = held_by[1] if held_by is not None else None
    before = state.assignments.get(request.job)
    key = writer.layout.assignment(state.host, request.job)
    planned = plan_change(
        writer.layout,
        view,
        Put(key, assignment.to_json(), lease),
        change_entry(before, assignment, writer.actor, stamp, reason),
        assignment,
        # The agent's record (inventory, health) was checked too: compare it.
        compares=[
            Compare(writer.layout.policy, snapshot.revision),
            Compare(writer.layout.agent(state.host), state.agent_revision),
        ],
        history=snapshot.policy.history,
        generation=writer.generation_value(stamp),
        lease=lease,
    )
    more = _charge(writer, snapshot.policy, [before] if before else [], [assignment])
    more = (more[0] + gated[0], more[1] + gated[1])
    return (assignment, decision), with_extra(planned, *more)


def _with_asker(writer: Writer, policy: Policy, request: Request) -> Request:
    """``request`` with who asks (the holder's subjects a reservation names), for placement."""

    if request.asker or not any(r.who for r in policy.reservations):
        return request
    standing = writer.standing(policy)
    asker = asker_of(policy, standing.holder, standing.groups)
    return replace_struct(request, asker=asker) if asker else request


def _gated(
    place_it: Callable[[Mapping[int, str]], Placement], gate: Gate | None, state: HostSnapshot
) -> tuple[Placement, tuple[list[Compare], list[Op]]]:
    """The placement and the wait queue's extra compares and writes (none without a gate).

    A ``count=N`` placed on GPUs a request ahead could use is placed once
    more around them (as if they were unavailable): other GPUs may be free
    that no one ahead could use. Still blocked: not its turn.
    """
    decision = place_it({})
    if gate is None:
        return decision, ([], [])

    try:
        return decision, gate(state, decision)
    except PlaceAround as around:
        wanted = dict.fromkeys(around.gpus, "wanted by a request ahead in the queue")
        try:
            again = place_it(wanted)
            return again, gate(state, again)
        except (PlacementRefused, PlaceAround):
            raise NotYourTurn(str(around)) from None


def _new_assignment(
    writer: Writer,
    snapshot: PolicySnapshot,
    request: Request,
    decision: Placement,
    *,
    host: str,
    stamp: str,
    reason: str,
    command: tuple[str, ...] | None,
    held_by: tuple[RunHolder, int] | None,
) -> Assignment:
    """The record ``decision`` makes of ``request`` on ``host``, by ``writer``'s holder."""
    from allocator.placement.request import describe_request

    standing = writer.standing(snapshot.policy)
    return Assignment(
        job=request.job,
        host=host,
        gpus=decision.gpus,
        mode=decision.mode,
        updated_by=writer.actor,
        updated_at=stamp,
        reason=reason,
        requested=describe_request(request),
        policy_revision=snapshot.revision,
        command=command,
        fallback_reason=decision.fallback_reason,
        slots=decision.slots,
        exclusive=decision.exclusive,
        picked=decision.picked,
        run=held_by[0] if held_by is not None else None,
        holder=standing.holder,
        charged=standing.charged,
        asker=request.asker[:64],
        preemptible=request.preemptible,
    )


def plan_release(
    writer: Writer,
    view: WriteView,
    job: str,
    reason: str,
    conditions: tuple[int | None, tuple[int, float] | None],
) -> tuple[Assignment | BadRecord, Planned]:
    """Plan removing ``job``'s assignment on ``view``'s host: what is removed, the plan.

    A damaged record is removed too (as the ``BadRecord`` that describes
    it); ``NotFound`` if the job holds nothing there. ``conditions``: the
    assignment key's revision to compare (``None``: any), and how the
    command that held it ended (exit status, GPU-seconds), for history.
    """
    if_revision, ended = conditions
    state = view.host
    host = state.host
    key = writer.layout.assignment(host, job)
    current: Assignment | BadRecord | None = state.assignments.get(job)
    if current is None:
        current = next((bad for bad in state.bad_records if bad.key == key), None)
    if current is None:
        raise job_not_found(job, host, list(state.assignments))
    compares = [] if if_revision is None else [Compare(key, if_revision)]
    held = current if isinstance(current, Assignment) else None
    policy = view.policy.policy if view.policy is not None else None
    writer.standing(policy).check_owners([held])
    stamp = format_time(writer.clock())
    entry = release_entry(host, job, held, writer.actor, stamp, reason, ended)
    planned = plan_change(
        writer.layout,
        view,
        Delete(key),
        entry,
        None,
        compares=compares,
        generation=writer.generation_value(stamp),
    )
    if held is not None and held.charged and view.policy is not None:
        planned = with_extra(planned, *_charge(writer, view.policy.policy, [held], []))
    return current, planned


def _charge(
    writer: Writer,
    policy: Policy,
    before: Sequence[Assignment],
    after: Sequence[Assignment],
) -> tuple[list[Compare], list[Op]]:
    """The quota counters' compares and writes; nothing read when no one is charged."""
    if not any(a.charged for a in (*before, *after)):
        return [], []
    # Here, not at the top: a `set` where no one is charged never loads the quota code.
    from allocator.control.quotas import charge

    return charge(writer, policy, before, after)


def view_reads_for(layout: KeyLayout, host: str, job: str) -> list[Read]:
    """What a failed change brings back: the view's reads, the policy's revision only."""
    return view_reads(layout, host, job, policy_text=False)


def with_extra(planned: Planned, compares: list[Compare], ops: list[Op]) -> Planned:
    """``planned`` with more compares and writes in the same transaction."""
    if not compares and not ops:
        return planned
    return Planned([*planned.compares, *compares], [*planned.ops, *ops], planned.after)


def check_adhoc_command(policy: Policy, job: str) -> None:
    """An ad-hoc command runs only where the reviewed policy allows it for that job."""
    spec = policy.jobs.get(job)
    if spec is None:
        raise RequestError(
            f"job {job!r} is not declared in the policy, so it cannot be given a command="
        )
    if not spec.allow_adhoc_command:
        raise RequestError(
            f"the policy does not allow ad-hoc commands for job {job!r} "
            "(set allow_adhoc_command: true on the job to permit command=)"
        )
