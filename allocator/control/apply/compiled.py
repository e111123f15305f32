"""The compiled policy, written: in the apply's transaction, or refreshed after an upgrade.

See :mod:`allocator.policy.compiled` for what the compiled record is. A
compiled policy too large to travel beside the YAML in one transaction is
written in parts first (one put each, named by the SHA-256 of their joined
JSON, so writing them twice or for a losing apply harms no reader); the
transaction then stores the record naming them. Parts no record names any
more are deleted after a successful apply, except the previous policy's,
which a reader may still be joining.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.errors import BadRecord, PermissionDenied
from allocator.policy.compiled import PART_BYTES, Compiled, split_compiled
from allocator.policy.model import Policy
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import CompiledPolicyRecord
from allocator.status.applied_policy import current_compiled
from allocator.store.base import MAX_VALUE_BYTES, Compare, Delete, Op, Put, Read, Store

__all__ = [
    "TXN_VALUE_BUDGET",
    "compiled_op",
    "drop_stale_parts",
    "previous_parts",
    "refresh_compiled",
    "write_with_compiled",
]

#: The most bytes the policy record and its compiled record may take together:
#: Consul base64-encodes (4/3) the values of a transaction body of at most 512
#: KiB, and the apply's history entry and keys need some of it.
TXN_VALUE_BUDGET = MAX_VALUE_BYTES * 3 // 4 - 16 * 1024

Txn = Callable[[list[Compare], list[Op]], int]


def compiled_op(
    store: Store,
    layout: KeyLayout,
    policy: Policy,
    sha256: str,
    record_size: int,
    part_bytes: int | None = None,
) -> tuple[Op, str | None]:
    """What the apply's transaction does with the compiled record; its parts written first.

    A put of ``policy`` compiled: in the record itself when it fits next to
    the policy record (``record_size`` bytes) in one transaction, else
    naming its parts, which are stored here. A user who may not write the
    parts gets a delete of any older record instead (commands then parse
    the YAML). The second item is the parts' hash, when there are parts.
    """
    size = PART_BYTES if part_bytes is None else part_bytes
    compiled = split_compiled(policy, sha256, TXN_VALUE_BUDGET - record_size, size)
    try:
        _put_parts(store, layout, compiled)
    except PermissionDenied:
        return Delete(layout.compiled_policy), None
    parts = compiled.body_sha256 if compiled.parts else None
    return Put(layout.compiled_policy, compiled.record), parts


def _put_parts(store: Store, layout: KeyLayout, compiled: Compiled) -> None:
    for index, part in enumerate(compiled.parts):
        store.put(layout.compiled_part(compiled.body_sha256, index), part)


def write_with_compiled(
    txn: Txn, compares: list[Compare], ops: list[Op], compiled: Op
) -> tuple[int, bool]:
    """Run the apply's transaction with ``compiled`` in it: its revision, and whether it stored one.

    A user allowed to write the policy but not the compiled key (a CI role
    granted before there was one) still applies the policy, without its
    compiled form: commands then parse the YAML.
    """
    try:
        return txn(compares, [*ops, compiled]), isinstance(compiled, Put)
    except PermissionDenied:
        return txn(compares, ops), False


def previous_parts(store: Store, layout: KeyLayout) -> str | None:
    """The parts' hash of the compiled record stored now, if it has parts (read before an apply)."""
    item = store.get(layout.compiled_policy)
    if item is None:
        return None
    try:
        record = decode_record(item.value, CompiledPolicyRecord, item.key)
    except BadRecord:  # a damaged record names no parts worth keeping
        return None
    return record.body_sha256


def drop_stale_parts(store: Store, layout: KeyLayout, keep: set[str]) -> None:
    """Delete the parts of every compiled policy whose hash is not in ``keep``.

    Best effort: a user who may not delete them leaves them (they cost
    space, never a wrong read).
    """
    root = layout.compiled_parts_root
    try:
        (listing,) = store.read_many([Read(root, prefix=True, values=False)])
        for item in listing.items:
            if item.key[len(root) :].split("/", 1)[0] not in keep:
                store.delete(item.key)
    except PermissionDenied:
        return


def refresh_compiled(
    store: Store, layout: KeyLayout, policy: Policy, record: bytes, sha256: str, revision: int
) -> bool:
    """Write the compiled form of the applied ``policy`` if it is missing or stale.

    ``record`` is the stored policy record, at ``revision``; the write
    compares that revision, so a policy applied meanwhile is never given
    this one's compiled form. A re-apply of the same file after an upgrade
    is how an operator gets the fast path back. Returns whether the stored
    compiled form is current now: not when this user may not write its key.
    """
    if current_compiled(store, layout, sha256, lambda _bad: None) is not None:
        return True
    op, _ = compiled_op(store, layout, policy, sha256, len(record))
    try:
        if isinstance(op, Put) or store.get(op.key) is not None:
            store.txn([Compare(layout.policy, revision)], [op])
    except PermissionDenied:
        return False
    return isinstance(op, Put)
