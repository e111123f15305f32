"""Deciding one job's change on one host: pure functions, no I/O, the time handed in.

A ``set`` is placed by :func:`place_request` and written by the plan
:func:`plan_assign` makes of that placement; :func:`plan_release` plans a
``release``. Each decides from a :class:`~allocator.control.write_cache.WriteView`
and a :class:`PlanContext`: who writes and their standing, the time, the
quota counters the change moves, all read beforehand by the attempt that
runs the plan (:mod:`allocator.control.one_host`). The plan compares what it
was decided from, counters included, so state that moved meanwhile fails
the write instead of being overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING

from msgspec import Struct

from allocator.control.holder import asker_of
from allocator.control.owners import Standing
from allocator.control.write_cache import Planned, WriteView, generation_value, plan_change
from allocator.errors import BadRecord, ConflictError, RequestError
from allocator.history.entries import change_entry, release_entry
from allocator.records.codec import replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry, RunHolder
from allocator.status.snapshots import job_not_found
from allocator.store import Compare, Delete, KeyValue, Op, Put
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.placement.choose import Placement, Request
    from allocator.policy import Policy
    from allocator.status.snapshots import PolicySnapshot

__all__ = [
    "NO_COUNTERS",
    "Held",
    "PlanContext",
    "check_adhoc_command",
    "place_request",
    "plan_assign",
    "plan_release",
    "with_extra",
]

#: The counters of a change no one is charged for: none read.
NO_COUNTERS: Mapping[str, KeyValue | None] = MappingProxyType({})


class PlanContext(Struct, frozen=True):
    """What a plan is decided from besides its view, read before planning.

    ``counters``: the quota counter of every subject the change charges or
    gives back to (the holder's ``standing.charged`` and those the record it
    replaces names); ``gone``: charges (``host/job``) found to have no
    assignment any more, dropped from the counters with their absence compared.
    """

    layout: KeyLayout
    actor: str
    now: datetime
    standing: Standing
    counters: Mapping[str, KeyValue | None] = NO_COUNTERS
    gone: frozenset[str] = frozenset()


#: What a ``set`` may carry besides the request: an ad-hoc command, and the
#: holding process (its record and store lease).
Held = tuple[tuple[str, ...] | None, tuple[RunHolder, int] | None]


def place_request(
    view: WriteView,
    request: Request,
    held: Held,
    context: PlanContext,
    around: Mapping[int, str] = MappingProxyType({}),
) -> tuple[Request, Placement]:
    """Check ``request`` against ``view`` and place it there: (the request with its asker, where).

    Raises ``NotPermitted`` naming the holder when the job is someone else's,
    and what placement raises (a ``PlacementRefused`` naming the job holding
    a GPU, a GPU reserved for others). ``around``: GPUs to place around (GPU
    -> why), as if unavailable.
    """
    from allocator.placement.choose import place

    command, held_by = held
    snapshot = _policy_of(view)
    if command is not None:
        check_adhoc_command(snapshot.policy, request.job)
    state = view.host
    request = _with_asker(context.standing, request)
    if held_by is not None and (request.job in state.assignments or view.index.hosts):
        raise ConflictError(
            f"job {request.job!r} already holds an assignment: "
            "`allocator run` takes GPUs for a job that holds none (pick another job=)"
        )
    # Whose it is comes before whether it fits: a refusal names the holder, not a GPU.
    context.standing.check_owners([state.assignments.get(request.job)])
    agent = state.agent
    placed = place(
        snapshot.policy,
        request,
        state.assignments,
        context.now,
        inventory=agent.gpus if agent and agent.gpus else None,
        unhealthy={**(agent.unhealthy if agent else {}), **around},
    )
    return request, placed


def plan_assign(
    view: WriteView,
    request: Request,
    decision: Placement,
    reason: str,
    held: Held,
    context: PlanContext,
    *,
    passed: str = "",
) -> tuple[Assignment, Planned]:
    """The record ``decision`` makes of ``request`` and the one transaction writing it.

    ``passed``: the waiting requests an operator's direct ``set`` passed, said
    in its history entry. Raises ``OverQuota`` when the change would take a subject over a quota
    (``context.counters`` counted, less ``context.gone``).
    """
    command, held_by = held
    snapshot, state = _policy_of(view), view.host
    stamp = format_time(context.now)
    before_end = state.assignments.get(request.job)
    assignment = _new_assignment(
        context,
        snapshot,
        request,
        decision,
        host=state.host,
        why=(reason, command),
        held_by=held_by,
        ends_at=limit_end(snapshot.policy, request, before_end, context.now),
    )
    lease = held_by[1] if held_by is not None else None
    before = state.assignments.get(request.job)
    layout = context.layout
    planned = plan_change(
        layout,
        view,
        Put(layout.assignment(state.host, request.job), assignment.to_json(), lease),
        _passing(change_entry(before, assignment, context.actor, stamp, reason), passed),
        assignment,
        # The agent's record (inventory, health) was checked too: compare it.
        compares=[
            Compare(layout.policy, snapshot.revision),
            Compare(layout.agent(state.host), state.agent_revision),
        ],
        history=snapshot.policy.history,
        generation=generation_value(context.actor, stamp),
        lease=lease,
    )
    charge = _charge(context, snapshot.policy, [before] if before else [], [assignment])
    return assignment, with_extra(planned, *charge)


def plan_release(
    view: WriteView,
    job: str,
    reason: str,
    conditions: tuple[int | None, tuple[int, float] | None],
    context: PlanContext,
) -> tuple[Assignment | BadRecord, Planned]:
    """Plan removing ``job``'s assignment on ``view``'s host: what is removed, the plan.

    A damaged record is removed too (as the ``BadRecord`` that describes
    it); ``NotFound`` if the job holds nothing there. ``conditions``: the
    assignment key's revision to compare (``None``: any), and how the
    command that held it ended (exit status, GPU-seconds), for history.
    """
    if_revision, ended = conditions
    state, layout = view.host, context.layout
    host = state.host
    key = layout.assignment(host, job)
    current: Assignment | BadRecord | None = state.assignments.get(job)
    if current is None:
        current = next((bad for bad in state.bad_records if bad.key == key), None)
    if current is None:
        raise job_not_found(job, host, list(state.assignments))
    compares = [] if if_revision is None else [Compare(key, if_revision)]
    held = current if isinstance(current, Assignment) else None
    context.standing.check_owners([held])
    stamp = format_time(context.now)
    entry = release_entry(host, job, held, context.actor, stamp, reason, ended)
    planned = plan_change(
        layout,
        view,
        Delete(key),
        entry,
        None,
        compares=compares,
        generation=generation_value(context.actor, stamp),
    )
    if held is not None and held.charged and view.policy is not None:
        planned = with_extra(planned, *_charge(context, view.policy.policy, [held], []))
    return current, planned


def _policy_of(view: WriteView) -> PolicySnapshot:
    # The attempt refuses a store with no policy before it plans a set.
    if view.policy is None:
        raise RequestError("no policy applied: run `allocator policy apply FILE` first")
    return view.policy


def _with_asker(standing: Standing, request: Request) -> Request:
    """``request`` with who asks (the holder's subjects a reservation names), for placement."""
    policy = standing.rules
    if request.asker or not any(r.who for r in policy.reservations):
        return request
    asker = asker_of(policy, standing.holder, standing.groups)
    return replace_struct(request, asker=asker) if asker else request


def _new_assignment(
    context: PlanContext,
    snapshot: PolicySnapshot,
    request: Request,
    decision: Placement,
    *,
    host: str,
    why: tuple[str, tuple[str, ...] | None],
    held_by: tuple[RunHolder, int] | None,
    ends_at: str = "",
) -> Assignment:
    """The record ``decision`` makes of ``request`` on ``host``, held by the context's holder."""
    from allocator.placement.request import describe_request

    return Assignment(
        job=request.job,
        host=host,
        gpus=decision.gpus,
        mode=decision.mode,
        updated_by=context.actor,
        updated_at=format_time(context.now),
        reason=why[0],
        requested=describe_request(request),
        policy_revision=snapshot.revision,
        command=why[1],
        fallback_reason=decision.fallback_reason,
        slots=decision.slots,
        exclusive=decision.exclusive,
        picked=decision.picked,
        run=held_by[0] if held_by is not None else None,
        holder=context.standing.holder,
        charged=context.standing.charged,
        asker=request.asker[:64],
        ends_at=ends_at,
        preemptible=request.preemptible,
    )


def limit_end(policy: Policy, request: Request, before: Assignment | None, now: datetime) -> str:
    """The ``ends_at`` the assignment gets: ``time=``, else the pool's default (``""``: none).

    A ``set`` over a job that holds GPUs without a new ``time=`` keeps its end:
    changing the GPUs does not give it more time. A limit above the pool's
    maximum raises ``RequestError`` (exit 2), before anything is written.
    """
    from allocator.placement.time_limit import end_time, resolve_limit

    if request.time is None and before is not None and before.ends_at:
        return before.ends_at
    pool = policy.pool_of(request.host)
    if pool is None:
        return end_time(now, resolve_limit(request.time, "", None, None))
    seconds = resolve_limit(request.time, pool.name, pool.default_time, pool.max_time)
    return end_time(now, seconds)


def _charge(
    context: PlanContext, policy: Policy, before: list[Assignment], after: list[Assignment]
) -> tuple[list[Compare], list[Op]]:
    """The quota counters' compares and writes, from the counters in ``context``."""
    if not any(a.charged for a in (*before, *after)):
        return [], []
    # Here, not at the top: a `set` where no one is charged never loads the quota code.
    from allocator.control.quotas import plan_healed

    layout, counters, gone = context.layout, context.counters, context.gone
    found = plan_healed(policy, layout, counters, before, after, gone)
    return found.compares, found.ops


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


def _passing(entry: HistoryEntry, passed: str) -> HistoryEntry:
    """``entry`` saying which waiting requests the change passed (an operator's direct set)."""
    if not passed:
        return entry
    return replace_struct(entry, detail="; ".join(p for p in (entry.detail, passed) if p))
