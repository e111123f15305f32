"""The policy's shares, written by ``policy apply`` (see :mod:`allocator.policy.shares`).

Only the shares a change changes are written: when the shares' head names
the policy being replaced, the stored shares are that policy's, so the
old and new policies' shares are compared here, with no read of them
(but the common share's: one damaged by hand is rewritten). Any
other head (none yet, another version's apply, an apply that stopped
half-way) makes the apply write every share and delete those of hosts no
longer in the policy.

Where they fit, the writes travel in the apply's own transaction. Else the
host shares are written first, in transactions of at most
:data:`~allocator.store.MAX_TXN_OPS` writes, under a head that says the
shares are incomplete; the apply's transaction then writes the common share
(so every host share written before it agrees with it) and the head. The
shares of hosts that left are deleted after it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from allocator.errors import BadRecord, CasConflict, PermissionDenied
from allocator.policy.model import Policy
from allocator.policy.shares import decode_common, share_record, split_policy
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.shares import SharesHead
from allocator.store import MAX_TXN_OPS, Compare, Delete, Op, Put, Read, Store

__all__ = ["SharesPlan", "batches", "plan_shares", "refresh_shares", "write_after", "write_before"]

#: Bytes of share records one batch transaction carries (well inside every backend's body).
BATCH_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class SharesPlan:
    """What an apply writes of the shares: before, in and after its transaction."""

    in_txn: list[Op]
    before: list[list[Op]] = field(default_factory=list)
    after: list[list[Op]] = field(default_factory=list)
    dirty_head: bytes | None = None  # put before the batches, when there are any


def plan_shares(
    store: Store,
    layout: KeyLayout,
    before: Policy | None,
    old_sha256: str | None,
    policy: Policy,
    sha256: str,
    room: tuple[int, int],
) -> SharesPlan:
    """The share writes that take the store from ``before``'s shares to ``policy``'s.

    ``room``: the operations and bytes the apply's transaction has left.
    """
    new = split_policy(policy)
    old = before if before is not None and _head(store, layout) == old_sha256 else None
    if old is None:
        changed, gone = dict(new.hosts), _stored_hosts(store, layout) - new.hosts.keys()
        common_changed = True
    else:
        previous = split_policy(old)
        changed = {h: b for h, b in new.hosts.items() if previous.hosts.get(h) != b}
        gone = previous.hosts.keys() - new.hosts.keys()
        common_changed = previous.common != new.common or not _common_intact(store, layout)
    head = Put(layout.shares_head, SharesHead(sha256).to_json())
    deletes: list[Op] = [Delete(layout.host_share(h)) for h in sorted(gone)]
    common = Put(layout.common_share, share_record(new.common, sha256, in_txn=True))
    if len(changed) + len(deletes) + 2 <= room[0]:  # else they cannot fit: not built
        txn_puts: list[Op] = [
            Put(layout.host_share(h), share_record(b, sha256, in_txn=True))
            for h, b in changed.items()
        ]
        ops = [*([common] if common_changed else []), *txn_puts, *deletes, head]
        if len(ops) <= room[0] and _size(ops) <= room[1]:
            return SharesPlan(ops)
    puts = [Put(layout.host_share(h), share_record(b, sha256)) for h, b in changed.items()]
    return SharesPlan(
        [common, head],
        before=list(batches(puts)),
        after=list(batches(deletes)),
        dirty_head=SharesHead("").to_json(),
    )


def write_before(store: Store, layout: KeyLayout, plan: SharesPlan) -> list[Op]:
    """The host shares that do not fit the apply's transaction, under a head saying so.

    Returns the share writes for the apply's transaction: none when this
    user may not write the shares (the apply then stores the policy without).
    """
    try:
        if plan.dirty_head is not None:
            store.put(layout.shares_head, plan.dirty_head)
        for batch in plan.before:
            store.txn([], batch)
    except PermissionDenied:
        return []
    return plan.in_txn


def write_after(store: Store, plan: SharesPlan) -> None:
    """The deletes of the shares of hosts that left, after the apply's transaction."""
    for batch in plan.after:
        store.txn([], batch)


def _head(store: Store, layout: KeyLayout) -> str | None:
    item = store.get(layout.shares_head)
    if item is None:
        return None
    try:
        return decode_record(item.value, SharesHead, item.key).policy_sha256 or None
    except BadRecord:  # a damaged head vouches for nothing: every share is written
        return None


def _common_intact(store: Store, layout: KeyLayout) -> bool:
    """Whether the stored common share decodes (one that does not is rewritten, not kept)."""
    item = store.get(layout.common_share)
    if item is None:
        return False
    try:
        return decode_common(item.value, item.key) is not None
    except BadRecord:
        return False


def _stored_hosts(store: Store, layout: KeyLayout) -> set[str]:
    """The hosts that have a share stored (their keys only)."""
    root = layout.host_shares
    (listing,) = store.read_many([Read(root, prefix=True, values=False)])
    return {item.key[len(root) :].split("/", 1)[0] for item in listing.items}


def _size(ops: Sequence[Op]) -> int:
    return sum(len(op.key) + (len(op.value) if isinstance(op, Put) else 0) for op in ops)


def batches(ops: Sequence[Op], room: int = 0) -> Iterator[list[Op]]:
    """``ops`` in transactions of at most MAX_TXN_OPS writes and about BATCH_BYTES.

    ``room``: operations each transaction keeps free for its compares.
    """
    batch: list[Op] = []
    size = 0
    for op in ops:
        grows = len(op.key) + (len(op.value) if isinstance(op, Put) else 0)
        if batch and (len(batch) >= MAX_TXN_OPS - room or size + grows > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(op)
        size += grows
    if batch:
        yield batch


def refresh_shares(
    store: Store, layout: KeyLayout, policy: Policy, sha256: str, revision: int
) -> None:
    """Write the applied ``policy``'s shares (at ``revision``) unless the head vouches for them.

    A re-apply of the same file after an upgrade, or after an apply that
    stopped half-way, is how the shares are made whole. The transaction
    compares the policy's revision: a policy applied meanwhile keeps its own.
    """
    try:
        if _head(store, layout) == sha256:
            return
        plan = plan_shares(store, layout, None, None, policy, sha256, (0, 0))
        if write_before(store, layout, plan):
            store.txn([Compare(layout.policy, revision)], plan.in_txn)
            write_after(store, plan)
    except (PermissionDenied, CasConflict):  # may not write them, or a newer policy has its own
        return
