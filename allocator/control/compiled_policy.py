"""The compiled policy, written: in the apply's transaction, or refreshed after an upgrade.

See :mod:`allocator.policy.compiled` for what the compiled record is.
"""

from __future__ import annotations

from collections.abc import Callable

from allocator.errors import PermissionDenied
from allocator.policy.compiled import compile_policy
from allocator.policy.model import Policy
from allocator.records.keys import KeyLayout
from allocator.status.applied_policy import current_compiled
from allocator.store.base import MAX_VALUE_BYTES, Compare, Delete, Op, Put, Store

__all__ = ["TXN_VALUE_BUDGET", "compiled_op", "refresh_compiled", "write_with_compiled"]

#: The most bytes the policy record and its compiled record may take together:
#: Consul base64-encodes (4/3) the values of a transaction body of at most 512
#: KiB, and the apply's history entry and keys need some of it.
TXN_VALUE_BUDGET = MAX_VALUE_BYTES * 3 // 4 - 16 * 1024

Txn = Callable[[list[Compare], list[Op]], int]


def compiled_op(layout: KeyLayout, policy: Policy, sha256: str, record_size: int) -> Op:
    """What the apply's transaction does with the compiled record.

    A put of ``policy`` compiled, or, when it would not fit next to the
    policy record (``record_size`` bytes) in one transaction, a delete of
    any older one.
    """
    compiled = compile_policy(policy, sha256)
    if record_size + len(compiled) > TXN_VALUE_BUDGET:
        return Delete(layout.compiled_policy)
    return Put(layout.compiled_policy, compiled)


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


def refresh_compiled(
    store: Store, layout: KeyLayout, policy: Policy, record: bytes, sha256: str, revision: int
) -> bool:
    """Write the compiled form of the applied ``policy`` if it is missing or stale.

    ``record`` is the stored policy record, at ``revision``; the write
    compares that revision, so a policy applied meanwhile is never given
    this one's compiled form. A re-apply of the same file after an upgrade
    is how an operator gets the fast path back. Returns whether the stored
    compiled form is current now: not when the policy is too large to have
    one, or this user may not write its key.
    """
    if current_compiled(store, layout, sha256, lambda _bad: None) is not None:
        return True
    op = compiled_op(layout, policy, sha256, len(record))
    try:
        if isinstance(op, Put) or store.get(op.key) is not None:
            store.txn([Compare(layout.policy, revision)], [op])
    except PermissionDenied:
        return False
    return isinstance(op, Put)
