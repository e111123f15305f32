"""Queueing submitted jobs: their records and queue entries, written in one transaction.

Each task of a submission is a record under the submitter's own prefix
(:meth:`~allocator.records.keys.KeyLayout.submission`) and an entry in its
host's queue pointing to it, so the turn rule, ``allocator queue`` and the
status see it as they see any waiter. Every record is compared absent:
a job name already submitted by the same user is a conflict, and nothing of
the batch is written then.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.control.holder import priority_of
from allocator.errors import CasConflict, ConflictError, RequestError
from allocator.placement.time_limit import resolve_limit
from allocator.recipes.queue.share import Share, read_share
from allocator.records.holders import QueueEntry
from allocator.records.submission import Submission
from allocator.store import Compare, Op, Put
from allocator.util.durations import duration_text
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.placement.request import Request
    from allocator.policy import Policy
    from allocator.recipes.context import Context

__all__ = ["BatchJob", "requeue", "submit", "task_names"]


@dataclass(frozen=True, slots=True)
class BatchJob:
    """What one ``allocator submit`` asks: the request, the command and its array."""

    request: Request
    argv: tuple[str, ...]
    cwd: str
    output: str = ""
    time_s: float | None = None
    array: range | None = None
    preemptible: bool = False
    grace_s: float | None = None


def task_names(job: str, array: range | None) -> list[tuple[str, int | None]]:
    """Each task's job name and array index: ``job`` alone, else ``job-<i>`` (pure)."""
    if array is None:
        return [(job, None)]
    return [(f"{job}-{index}", index) for index in array]


def submit(allocator: Context, batch: BatchJob) -> list[str]:
    """Queue every task of ``batch`` on its host; return their job names.

    ``RequestError`` for a host the policy does not name, ``ConflictError``
    when one of the names is already submitted (nothing is written then).
    """
    request, user = batch.request, allocator.holder
    layout = allocator.layout
    policy = allocator.require_policy().policy
    if not policy.names_host(request.host):  # no agent would ever run it
        raise RequestError(f"host {request.host!r} is not in the policy: no agent runs jobs there")
    _check_time(policy, request.host, batch.time_s)
    # Fixed at joining, as every waiter's are (recipes/queue/share.py says why).
    share = read_share(allocator, policy, user)
    stamp = format_time(allocator.clock())
    priority = priority_of(policy, user, allocator.holder_groups(policy), None)
    compares: list[Compare] = []
    ops: list[Op] = []
    names = task_names(request.job, batch.array)
    for name, index in names:
        record = _record(batch, user, name, index, stamp)
        key = layout.submission(user, name)
        compares.append(Compare(key, 0))
        ops.append(Put(key, record.to_json()))
        entry = _entry(record, (priority, share), request.describe())
        ops.append(Put(layout.queue_entry(request.host, secrets.token_hex(8)), entry.to_json()))
    ops.append(Put(layout.queue_arrivals(request.host), stamp.encode()))
    try:
        allocator.store.txn(compares, ops)
    except CasConflict:
        taken = _already(allocator, user, [n for n, _ in names])
        raise ConflictError(f"already submitted by {user}: job {taken}") from None
    return [name for name, _ in names]


def _check_time(policy: Policy, host: str, seconds: float | None) -> None:
    """A ``time=`` above the pool's maximum is refused now, not when the agent takes it."""
    pool = policy.pool_of(host)
    if seconds is not None and pool is not None:
        resolve_limit(duration_text(seconds), pool.name, pool.default_time, pool.max_time)


def _record(batch: BatchJob, user: str, name: str, index: int | None, stamp: str) -> Submission:
    request = batch.request
    return Submission(
        job=name,
        user=user,
        host=request.host,
        argv=batch.argv,
        cwd=batch.cwd,
        submitted_at=stamp,
        gpus=request.gpus,
        count=request.count,
        slots=request.slots,
        output=batch.output,
        array_index=index,
        time_s=batch.time_s,
        preemptible=batch.preemptible,
        grace_s=batch.grace_s,
    )


def _entry(record: Submission, place: tuple[int, Share | None], requested: str) -> QueueEntry:
    """The task's queue entry: its place (priority, fair share) fixed now, as any waiter's."""
    priority, share = place
    return QueueEntry(
        job=record.job,
        host=record.host,
        holder=record.user,
        since=record.submitted_at,
        gpus=record.gpus,
        count=record.count,
        slots=record.slots,
        priority=priority,
        requested=requested,
        self_service=True,
        submission=f"{record.user}/{record.job}",
        fair_share=share.factor if share else None,
        usage=share.usage if share else None,
        preemptible=record.preemptible,
    )


def requeue(allocator: Context, record: Submission) -> None:
    """Queue ``record`` again (a preempted job): a new entry pointing to the same record.

    Its priority is its user's now, as a new submission's would be.
    """
    layout = allocator.layout
    policy = allocator.require_policy().policy
    priority = priority_of(policy, record.user, allocator.holder_groups(policy), None)
    # Its place again as a new waiter's: the fair share as it stands now.
    share = read_share(allocator, policy, record.user)
    entry = _entry(record, (priority, share), _requested(record))
    key = layout.queue_entry(record.host, secrets.token_hex(8))
    stamp = format_time(allocator.clock())
    ops: list[Op] = [
        Put(key, entry.to_json()),
        Put(layout.queue_arrivals(record.host), stamp.encode()),
    ]
    allocator.store.txn([], ops)


def _requested(record: Submission) -> str:
    asked = (
        f"count={record.count}"
        if record.gpus is None
        else "gpus=" + ",".join(map(str, record.gpus))
    )
    return asked + (f" slots={record.slots}" if record.slots is not None else "")


def _already(allocator: Context, user: str, names: Sequence[str]) -> str:
    for name in names:
        if allocator.store.get(allocator.layout.submission(user, name)) is not None:
            return repr(name)
    return "(unknown)"
