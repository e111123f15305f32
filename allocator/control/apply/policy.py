"""``policy apply``: store a new policy only if the current assignments still fit it.

The apply compares the old policy's revision and the fleet generation it
checked the assignments at, so an assignment made during its check makes it
check again instead of landing over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.control.apply import compiled as compiled_policy
from allocator.control.apply.compiled import (
    compiled_op,
    drop_stale_parts,
    previous_parts,
    refresh_compiled,
    write_with_compiled,
)
from allocator.control.apply.scope import (
    affected_hosts,
    read_every_host,
    read_hosts,
    read_index_entries,
)
from allocator.control.apply.shares import (
    SharesPlan,
    plan_shares,
    refresh_shares,
    write_after,
    write_before,
)
from allocator.control.job_index import holders, index_covers
from allocator.errors import (
    BadRecord,
    CasConflict,
    Compacted,
    PermissionDenied,
    PlacementRefused,
    PolicyError,
    RequestError,
)
from allocator.history.append import prepare_append
from allocator.history.entries import policy_entry
from allocator.history.stream import policy_stream
from allocator.records.codec import decode_record
from allocator.records.types import PolicyRecord
from allocator.status.applied_policy import applied_policy
from allocator.status.snapshots import snapshots_by_host
from allocator.store import MAX_TXN_OPS, Compare, KeyValue, Op, Put, Read, txn_size
from allocator.util.times import format_time

if TYPE_CHECKING:
    from allocator.control.writer import Writes
    from allocator.policy import Policy

__all__ = ["ApplyResult", "apply_once", "violations"]


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What ``policy apply`` did."""

    changed: bool
    record: PolicyRecord
    revision: int
    warnings: tuple[str, ...] = ()
    compiled: bool = True  # the compiled form was stored too (see allocator.policy.compiled)
    shares: bool = True  # the shares were stored too (see allocator.policy.shares)


def apply_once(
    writer: Writes, policy: Policy, text: str, source: str, force: bool, reason: str
) -> ApplyResult:
    """One attempt of ``policy apply`` (see :meth:`Allocator.apply_policy`)."""
    from allocator.policy import policy_sha256

    current = writer.store.get(writer.layout.policy)
    digest = policy_sha256(text)
    old: PolicyRecord | None = None
    if current is not None:
        try:
            old = decode_record(current.value, PolicyRecord, current.key)
        except BadRecord as exc:  # a damaged record is what apply is there to replace
            writer.on_bad_record(exc)
        else:
            if old.sha256 == digest:
                revision = current.mod_revision
                fresh = refresh_compiled(
                    writer.store, writer.layout, policy, current.value, digest, revision
                )
                refresh_shares(writer.store, writer.layout, policy, digest, revision)
                return ApplyResult(False, old, revision, compiled=fresh)
    # Read before the assignments are checked: any assignment change after this
    # read moves it, and the compare below then sends apply round to check again.
    (fleet_read,) = writer.store.read_many([Read(writer.layout.fleet_generation)])
    fleet = fleet_read.items[0] if fleet_read.items else None
    before = _old_policy(writer, old)
    refused, indexed = _check(writer, policy, before, old, fleet_read.revision)
    if refused and not force:
        raise PlacementRefused(
            f"the new policy conflicts with {len(refused)} current assignment(s): "
            f"{refused[0]}"
            + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "")
            + "; release them first or use --force"
        )
    record = PolicyRecord(
        yaml=text,
        sha256=digest,
        applied_by=writer.actor,
        applied_at=format_time(writer.clock()),
        source=source,
        job_index=indexed,
    )
    compares = [
        Compare(writer.layout.policy, current.mod_revision if current is not None else 0),
        Compare(writer.layout.fleet_generation, fleet.mod_revision if fleet is not None else 0),
    ]
    entry = policy_entry(record, old, reason, len(refused))
    head_compare, history_ops = prepare_append(
        writer.store,
        policy_stream(writer.layout),
        entry,
        policy.history,
        writer.on_bad_record,
    )
    stored = record.to_json()
    revision, with_compiled, with_shares = _store(
        writer, (before, old), policy, digest, stored, [*compares, head_compare], history_ops
    )
    return ApplyResult(
        True, record, revision, tuple(refused), compiled=with_compiled, shares=with_shares
    )


def _store(
    writer: Writes,
    replaced: tuple[Policy | None, PolicyRecord | None],
    policy: Policy,
    digest: str,
    stored: bytes,
    compares: list[Compare],
    history_ops: list[Op],
) -> tuple[int, bool, bool]:
    """The apply's transaction with the compiled form and the shares.

    Compiled parts and the shares that do not fit are written before, stale
    parts and the shares of hosts that left after.
    """

    store, layout = writer.store, writer.layout
    ops: list[Op] = [Put(layout.policy, stored), *history_ops]
    # The budget read from its module at each apply, not bound at import: one value, wherever set.
    budget = compiled_policy.TXN_VALUE_BUDGET
    room = MAX_TXN_OPS - txn_size(compares, ops) - 1, (budget - len(stored)) // 2
    old_policy, old = replaced
    old_sha = old.sha256 if old is not None else None
    try:
        shares = plan_shares(store, layout, old_policy, old_sha, policy, digest, room)
    except PermissionDenied:  # may not read the shares: nor write them
        shares = SharesPlan([])
    share_ops = write_before(store, layout, shares)
    in_txn = sum(len(op.value) for op in share_ops if isinstance(op, Put))
    before = previous_parts(store, layout)
    compiled, parts = compiled_op(store, layout, policy, digest, len(stored) + in_txn)
    try:
        revision, with_compiled = write_with_compiled(
            writer.txn, compares, [*ops, *share_ops], compiled
        )
    except PermissionDenied:
        if not share_ops:
            raise
        # A role granted before there were shares: the policy without them (agents
        # then read the whole record: the shares' head no longer matches it).
        share_ops = []
        revision, with_compiled = write_with_compiled(writer.txn, compares, ops, compiled)
    if share_ops:
        write_after(store, shares)
    if before or parts:
        drop_stale_parts(store, layout, before | parts, revision, with_compiled)
    return revision, with_compiled, bool(share_ops)


def _check(
    writer: Writes,
    policy: Policy,
    before: Policy | None,
    old: PolicyRecord | None,
    revision: int,
) -> tuple[list[str], bool]:
    """The assignments ``policy`` refuses where it changes anything, and whether the index is whole.

    Only the hosts the change can affect are read (see
    :mod:`allocator.control.apply.scope`); the job index's completeness is
    then the old record's, which every write since has kept. A first apply,
    a change that can affect every host, or one over a policy applied before
    the index was whole (a store from before there was one) reads every host
    in ranges.
    """

    scope = affected_hosts(before, policy)
    if scope is None or old is None or not old.job_index:
        try:
            return _check_every_host(writer, policy, before, revision)
        except Compacted as exc:  # the revision read at is gone: an attempt lost, like a race
            key = writer.layout.fleet_generation
            raise CasConflict(f"revision {revision} was compacted", keys=(key,)) from exc
    refused: list[str] = []
    for items in read_hosts(writer.store, writer.layout, scope):
        refused += _refused(writer, policy, items)
    return refused, old.job_index


def _old_policy(writer: Writes, old: PolicyRecord | None) -> Policy | None:
    """The applied policy ``old`` holds; ``None`` if it no longer loads (every host is checked)."""

    if old is None:
        return None
    try:
        return applied_policy(writer.store, writer.layout, old, writer.on_bad_record)
    except PolicyError:
        return None


def _check_every_host(
    writer: Writes, policy: Policy, before: Policy | None, revision: int
) -> tuple[list[str], bool]:
    """Every host's assignments checked, read in ranges; and whether every one is indexed."""

    store, layout = writer.store, writer.layout
    declared = set(policy.hosts).union(before.hosts if before is not None else ())
    refused: list[str] = []
    held: dict[str, set[str]] = {}
    for items in read_every_host(store, layout, declared, revision):
        refused += _refused(writer, policy, items)
        for job, hosts in holders(items, layout).items():
            held.setdefault(job, set()).update(hosts)
    entries = itertools.chain.from_iterable(read_index_entries(store, layout, held, revision))
    return refused, index_covers(held, entries, layout)


def violations(
    writer: Writes, policy: Policy, host_items: Sequence[KeyValue] | None = None
) -> list[str]:
    """Current assignments that ``policy`` would refuse, one line each.

    ``host_items``: the hosts' keys to check, if the caller read them
    already; else every host's are read, in ranges (see
    :func:`allocator.control.apply.scope.read_every_host`).
    """
    if host_items is not None:
        return _refused(writer, policy, host_items)

    (head,) = writer.store.read_many([Read(writer.layout.fleet_generation)])
    found: list[str] = []
    for items in read_every_host(writer.store, writer.layout, policy.hosts, head.revision):
        found += _refused(writer, policy, items)
    return found


def _refused(writer: Writes, policy: Policy, host_items: Sequence[KeyValue]) -> list[str]:
    from allocator.placement.choose import Request, place
    from allocator.placement.reservations import asker_of_assignment

    found: list[str] = []
    now = writer.clock()
    for host, state in sorted(snapshots_by_host(host_items, writer.layout, 0).items()):
        inventory = state.agent.gpus if state.agent and state.agent.gpus else None
        for job, held in sorted(state.assignments.items()):
            if held.mode == "cpu":
                continue
            others = {j: a for j, a in state.assignments.items() if j != job}
            slots = held.slots if held.slots > 1 else None
            asker, own = asker_of_assignment(policy, held)
            request = Request(
                job=job, host=host, gpus=held.gpus, slots=slots, asker=asker, self_service=own
            )
            try:
                place(policy, request, others, now, inventory=inventory)
            except (PlacementRefused, RequestError) as exc:
                found.append(f"{job}@{host}: {exc}")
    return found
