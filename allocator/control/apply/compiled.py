"""The compiled policy, written: in the apply's transaction, or refreshed after an upgrade.

See :mod:`allocator.policy.compiled` for what the compiled record is. A
compiled policy too large to travel beside the YAML in one transaction is
written in parts, each under a key named by the SHA-256 of its content:
those not stored yet are written first (in a few transactions; writing
them twice or for a losing apply harms no reader), then the apply's
transaction stores the record naming them, the commit point. A one-host
change so writes the part or two that changed and the record. Parts no
record names any more are deleted after a successful apply, except the
previous policy's, which a reader may still be joining.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from allocator.control.apply.shares import batches
from allocator.errors import BadRecord, CasConflict, PermissionDenied
from allocator.policy.compiled import PART_BYTES, split_compiled
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
) -> tuple[Op, frozenset[str]]:
    """What the apply's transaction does with the compiled record; its new parts written first.

    A put of ``policy`` compiled: in the record itself when it fits next to
    the policy record (``record_size`` bytes) in one transaction, else
    naming its parts, of which those not stored yet are stored here. A
    user who may not write the parts gets a delete of any older record
    instead (commands then parse the YAML). The second item names the parts.
    """
    size = PART_BYTES if part_bytes is None else part_bytes
    compiled = split_compiled(policy, sha256, TXN_VALUE_BUDGET - record_size, size)
    try:
        _put_parts(store, layout, compiled.parts)
    except PermissionDenied:
        return Delete(layout.compiled_policy), frozenset()
    return Put(layout.compiled_policy, compiled.record), frozenset(compiled.parts)


def _put_parts(store: Store, layout: KeyLayout, parts: Mapping[str, bytes]) -> None:
    """The parts not stored yet, a few transactions of them (a part's key names its content)."""
    if not parts:
        return
    stored = _stored_parts(store, layout)
    puts: list[Op] = [
        Put(layout.compiled_part(name), part) for name, part in parts.items() if name not in stored
    ]
    for batch in batches(puts):
        store.txn([], batch)


def _stored_parts(store: Store, layout: KeyLayout) -> dict[str, int]:
    """The parts stored now by name, each with its mod_revision (keys only, no values)."""
    root = layout.compiled_parts_root
    (listing,) = store.read_many([Read(root, prefix=True, values=False)])
    return {item.key[len(root) :]: item.mod_revision for item in listing.items}


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


def previous_parts(store: Store, layout: KeyLayout) -> frozenset[str]:
    """The parts the compiled record stored now names (read before an apply)."""
    item = store.get(layout.compiled_policy)
    if item is None:
        return frozenset()
    try:
        record = decode_record(item.value, CompiledPolicyRecord, item.key)
    except BadRecord:  # a damaged record names no parts worth keeping
        return frozenset()
    return frozenset(record.part_sha256)


def drop_stale_parts(
    store: Store, layout: KeyLayout, keep: frozenset[str], revision: int, stored: bool
) -> None:
    """Delete every stored part whose name is not in ``keep``, as of this apply's ``revision``.

    ``stored``: whether the apply's transaction wrote the compiled record (else
    it deleted it, or left the old one where its writer may not write).

    Best effort: a user who may not delete them leaves them (they cost
    space, never a wrong read). Another apply may run meanwhile: a part
    written after ``revision`` is its, and each batch is deleted only while
    the compiled record is still the one this apply wrote, so a later apply's
    record never names a part deleted here.
    """
    try:
        stale: list[Op] = [
            Delete(layout.compiled_part(name))
            for name, written in sorted(_stored_parts(store, layout).items())
            if name not in keep and written <= revision
        ]
        still_ours = [Compare(layout.compiled_policy, revision if stored else 0)]
        for batch in batches(stale, room=1):
            store.txn(still_ours, batch)
    except (PermissionDenied, CasConflict):  # not ours to delete, or another apply's now
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
