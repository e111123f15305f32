"""Pure checks and decisions shared by the stores that live on this machine.

The memory and SQLite backends implement the same semantics with different
storage; everything that does not touch storage lives here so the two cannot
drift apart: argument validation, compare evaluation, history bounds and the
errors those produce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, cast

from allocator.errors import CasConflict, Compacted, InvalidInput, ValueTooLarge
from allocator.store.base import (
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    Op,
    Put,
    Read,
    TxnOutcome,
    read_each,
    txn_size,
    txn_then_read,
)
from allocator.store.parts import pages_of_whole, parts_of_whole, runs_read_each

if TYPE_CHECKING:
    from allocator.store.base import Listing, Store

__all__ = [
    "DEFAULT_HISTORY",
    "ConditionalWrites",
    "cas_conflict",
    "check_key",
    "check_limit",
    "check_not_compacted",
    "check_prefix",
    "check_reads",
    "check_ttl",
    "check_txn",
    "check_value",
    "expand_deletes",
    "failed_compares",
    "lease_of",
    "prefix_range",
    "resolve_start",
]

#: How many revisions of change history a local store keeps for watches.
DEFAULT_HISTORY = 10_000


def check_limit(limit: int | None) -> int | None:
    """Return ``limit`` if it is ``None`` or a positive ``int``, else raise ``InvalidInput``."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InvalidInput(f"list limit {limit!r} must be a whole number of at least 1")
    return limit


def check_reads(reads: Sequence[Read]) -> None:
    """Validate every key of a batch of reads before it is sent."""
    for read in reads:
        check_key(read.key)
        check_limit(read.limit)


def check_key(key: str, what: str = "key") -> str:
    """Return ``key`` if it is a ``str`` starting with ``/``, else raise ``InvalidInput``."""
    if not isinstance(key, str) or not key.startswith("/"):
        raise InvalidInput(f"store {what} {key!r} must be a string starting with '/'")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"store {what} {key!r} is not valid Unicode text") from exc
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix (it must start with ``/``)."""
    return check_key(prefix, "prefix")


def check_value(key: str, value: bytes) -> bytes:
    """Return ``value`` if it is ``bytes`` within ``MAX_VALUE_BYTES``.

    Raises ``ValueTooLarge`` naming the key, the size and the limit.
    """
    if not isinstance(value, bytes):
        raise InvalidInput(f"value for {key} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLarge(
            f"value for {key} is {len(value)} bytes; the limit is {MAX_VALUE_BYTES} bytes"
        )
    return value


def lease_of(lease: int | None) -> int | None:
    """Normalise a lease argument: ``None`` and ``0`` both mean "no lease"."""
    if lease is None or lease == 0:
        return None
    if not isinstance(lease, int) or lease < 0:
        raise InvalidInput(f"lease id {lease!r} must be a positive integer")
    return lease


def check_ttl(ttl: float) -> float:
    """Return ``ttl`` as a float if it is a positive number of seconds."""
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
        raise InvalidInput(f"lease TTL must be a positive number of seconds, not {ttl!r}")
    return float(ttl)


def check_txn(compares: Sequence[Compare], ops: Sequence[Op], max_ops: int | None = None) -> None:
    """Validate a transaction before anything is read or written.

    Every key must be valid, every value within the size limit, no key may
    be written twice (etcd refuses that too, and the outcome would depend on
    op order), and compares + writes must not pass ``max_ops`` (the
    backend's ``max_txn_ops``; ``None``: no limit).
    """
    size = txn_size(compares, ops)
    if max_ops is not None and size > max_ops:
        raise ValueTooLarge(
            f"transaction has {size} operations (compares and writes); this store "
            f"accepts at most {max_ops} (every backend accepts {MAX_TXN_OPS})"
        )
    for compare in compares:
        check_key(compare.key)
        if not isinstance(compare.mod_revision, int) or compare.mod_revision < 0:
            raise InvalidInput(
                f"compare on {compare.key}: revision {compare.mod_revision!r} must be >= 0"
            )
    seen: set[str] = set()
    for op in ops:
        check_key(op.key)
        if isinstance(op, Put):
            check_value(op.key, op.value)
            lease_of(op.lease)
        elif not isinstance(op, Delete):
            raise InvalidInput(f"unknown transaction operation {op!r}")
        if op.key in seen:
            raise InvalidInput(f"transaction writes {op.key} more than once")
        seen.add(op.key)
    for tree in (op.key for op in ops if isinstance(op, Delete) and op.prefix):
        if any(key != tree and key.startswith(tree) for key in seen):
            raise InvalidInput(f"transaction writes a key under {tree} and deletes them all")


def expand_deletes(
    ops: Sequence[Op], mod_revision_of: Callable[[str], int], keys_under: Callable[[str], list[str]]
) -> list[Op]:
    """``ops`` as the changes they make: a prefix delete as a delete of each key it finds,
    a delete of a key that is absent left out (it changes nothing)."""
    changes: list[Op] = []
    for op in ops:
        if isinstance(op, Put):
            changes.append(op)
        elif op.prefix:
            changes += [Delete(key) for key in keys_under(op.key)]
        elif mod_revision_of(op.key):
            changes.append(op)
    return changes


def failed_compares(
    compares: Sequence[Compare], mod_revision_of: Callable[[str], int]
) -> tuple[str, ...]:
    """Return the keys with a compare that does not hold, in the order given.

    ``mod_revision_of(key)`` returns the key's current mod_revision, or 0
    when the key does not exist (so a compare on 0 means "absent").
    """
    failed = (c.key for c in compares if mod_revision_of(c.key) != c.mod_revision)
    return tuple(dict.fromkeys(failed))  # each key once, first-failure order


def cas_conflict(
    compares: Sequence[Compare], failed: Sequence[str], mod_revision_of: Callable[[str], int]
) -> CasConflict:
    """Build the ``CasConflict`` for ``failed`` keys, saying what was expected and found."""
    parts = []
    for key in failed:
        have = mod_revision_of(key)
        want = next(c.mod_revision for c in compares if c.key == key and c.mod_revision != have)
        want_text = "absent" if want == 0 else f"at revision {want}"
        have_text = "absent" if have == 0 else f"at revision {have}"
        parts.append(f"{key} expected {want_text}, found {have_text}")
    return CasConflict("compare failed: " + "; ".join(parts), keys=tuple(failed))


def resolve_start(start_revision: int, current_revision: int) -> int:
    """The first revision a new watch delivers: ``start_revision``, or "after now" if <= 0."""
    if not isinstance(start_revision, int):
        raise InvalidInput(f"watch start revision {start_revision!r} must be an integer")
    return start_revision if start_revision > 0 else current_revision + 1


def check_not_compacted(cursor: int, compact_revision: int, prefix: str) -> None:
    """Raise ``Compacted`` if a watch at ``cursor`` needs history already dropped."""
    if cursor <= compact_revision:
        raise Compacted(
            f"watch on {prefix} asked for revision {cursor}, but history up to "
            f"revision {compact_revision} was compacted; re-read and watch again",
            compact_revision=compact_revision,
        )


def prefix_range(prefix: str) -> tuple[str, str]:
    """The half-open key range [low, high) holding exactly the keys starting with ``prefix``.

    Valid for stores that order keys by code point (or, equivalently, by
    their UTF-8 bytes): the successor of the last character bounds the range.
    """
    stem = prefix.rstrip("\U0010ffff")  # never empty: a prefix starts with "/"
    successor = ord(stem[-1]) + 1
    if 0xD800 <= successor <= 0xDFFF:  # surrogates are not characters; skip them
        successor = 0xE000
    return prefix, stem[:-1] + chr(successor)


class ConditionalWrites:
    """``put``, ``delete`` and ``txn`` of the Store protocol, built on one ``_apply``,
    and ``read_many`` and ``txn_or_read`` as a local store answers them (a read at a time).

    A subclass implements ``_apply(compares, ops)``: check the compares,
    apply the ops at one new revision, and return (store revision, number
    of keys changed).
    """

    def _apply(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        raise NotImplementedError

    def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_revision: int | None = None,
        lease: int | None = None,
    ) -> int:
        """Write ``key``; return the new store revision."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        return self._apply(compares, [Put(key, value, lease)])[0]

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed."""
        compares = [] if expect_revision is None else [Compare(key, expect_revision)]
        return self._apply(compares, [Delete(key)])[1] > 0

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if every compare holds; return the revision."""
        return self._apply(compares, ops)[0]

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One listing per item of ``reads`` (one local read each)."""
        return read_each(cast("Store", self), reads)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """``txn``; when a compare fails, the ``reads`` instead of ``CasConflict``."""
        return txn_then_read(cast("Store", self), compares, ops, reads)

    def list_parts(
        self, prefix: str, revision: int, splits: Sequence[str] = ()
    ) -> Iterator[Listing]:
        """Every key under ``prefix`` as it is now, cut at ``splits`` (see Store)."""
        return parts_of_whole(cast("Store", self), prefix, splits)

    def list_runs(self, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        """Every key under each run's prefixes as it is now, one listing per run (see Store)."""
        return runs_read_each(cast("Store", self), runs, revision)

    def list_pages(self, prefix: str, revision: int, page_keys: int) -> Iterator[Listing]:
        """Every key under ``prefix`` as it is now, ``page_keys`` to a listing (see Store)."""
        return pages_of_whole(cast("Store", self), prefix, page_keys)
