"""The Store protocol every backend implements, and the plain data it speaks.

Semantics (the contract suite in ``tests/contract`` checks all of them on
every backend):

* Keys are ``str`` beginning with ``/`` (a backend that cannot store a
  leading slash, like Consul, maps it internally); values are ``bytes``.
* The store has one global, monotonically increasing ``revision``. Every
  successful write (put, delete, transaction) increments it by exactly one;
  every key version remembers the revision that wrote it (``mod_revision``)
  and the revision that created it (``create_revision``).
* ``expect_revision`` on put/delete is a compare-and-swap: ``0`` means "the
  key must not exist", ``n > 0`` means "the key's mod_revision must be n".
  A failed compare raises :class:`~allocator.errors.CasConflict` and writes
  nothing.
* A transaction applies all its operations at one revision, or none.
* A watch on a prefix delivers every change with ``revision >= start``, in
  revision order, at most once. A watch whose history was compacted raises
  :class:`~allocator.errors.Compacted`; a watch whose connection broke
  raises :class:`~allocator.errors.StoreUnavailable` (never hangs silently).
  The caller then re-reads with :meth:`Store.list` and watches again from
  the revision that read returned + 1. Backends with history (etcd, SQLite,
  memory) deliver every version; Consul keeps none, so its watch coalesces
  the changes made between two blocking reads into the latest version of
  each key (still in revision order, still at most once), and a watch from
  a revision it cannot replay raises ``Compacted`` rather than miss a
  delete (it can replay from a listing this process made at ``start - 1``,
  or from where an earlier watch left off). Callers must be level-based:
  react to "this changed", not count events.
* ``list`` returns keys in key order, or descending with ``descending``;
  ``limit`` cuts it to the first ``limit`` keys in that order, read at the
  cost of those keys (etcd: a range's ``limit`` and ``sort_order``; SQLite:
  ``ORDER BY``/``LIMIT``; Consul: the key names only, then the values of
  the chosen keys in one transaction).
* A lease is a TTL: keys put with a lease are deleted (with delete events)
  when the lease expires or is revoked, unless it is refreshed in time.
* A transaction holds at most ``max_txn_ops`` operations, compares and
  writes counted together (Consul: 64; etcd: 128, its default
  ``--max-txn-ops``; SQLite: no limit). Callers build every transaction
  within :data:`MAX_TXN_OPS`, the smallest, so what works on one backend
  works on all; :func:`txn_size` counts one. The memory backend enforces
  :data:`MAX_TXN_OPS` itself, so tests catch a caller that would break on
  Consul.

The values here are msgspec Structs, not dataclasses: every command defines
them at start-up, and a dataclass takes about half a millisecond to define.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal, Protocol, runtime_checkable

from msgspec import Struct

from allocator.errors import BadRecord, CasConflict

__all__ = [
    "MAX_TXN_OPS",
    "MAX_VALUE_BYTES",
    "Compare",
    "Delete",
    "Event",
    "KeyValue",
    "Listing",
    "Op",
    "Put",
    "Read",
    "Store",
    "TxnOutcome",
    "Watch",
    "bad_key_records",
    "key_or_none",
    "key_text",
    "read_each",
    "txn_size",
    "txn_then_read",
]

#: The largest value every backend accepts: Consul's default KV limit is
#: 512 KiB; etcd's default request limit is 1.5 MiB. One limit for all keeps
#: behaviour identical whichever backend an operator picks.
MAX_VALUE_BYTES = 512 * 1024

#: The most operations (compares + writes) one transaction may hold on every
#: backend: Consul's limit. A caller that keeps within it works everywhere.
MAX_TXN_OPS = 64


class KeyValue(Struct, frozen=True):
    """One stored key and the revisions that describe its current version."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int | None = None


class Listing(Struct, frozen=True):
    """The result of a prefix read: the items and the store revision it saw.

    ``bad_keys`` names (escaped, see :func:`key_text`) the keys the read found
    that are not UTF-8 text: they are left out of ``items``, and whoever
    reports bad records reports them, as a bad value is reported.
    """

    items: tuple[KeyValue, ...]
    revision: int
    bad_keys: tuple[str, ...] = ()


class Event(Struct, frozen=True):
    """A change seen by a watch. ``value`` is ``None`` for deletes."""

    type: Literal["put", "delete"]
    key: str
    value: bytes | None
    revision: int


class Compare(Struct, frozen=True):
    """A transaction guard: ``key``'s mod_revision must equal ``mod_revision``.

    ``mod_revision == 0`` means the key must not exist.
    """

    key: str
    mod_revision: int


class Put(Struct, frozen=True):
    """A transaction operation writing ``value`` at ``key``."""

    key: str
    value: bytes
    lease: int | None = None


class Delete(Struct, frozen=True):
    """A transaction operation deleting ``key`` (no error if absent).

    ``prefix``: every key starting with ``key`` instead (one operation, no
    read: etcd's DeleteRange, Consul's ``delete-tree``).
    """

    key: str
    prefix: bool = False


Op = Put | Delete


class Read(Struct, frozen=True):
    """One read of a batch: ``key`` itself, or every key under it when ``prefix``.

    ``values`` ``False`` asks only for the keys and their revisions (a
    caller that only needs to know whether a large value changed).
    ``limit`` and ``descending`` (with ``prefix``) are :meth:`Store.list`'s.
    ``newest`` (with ``prefix``): the keys last written most recently first
    (highest modification revision), ``limit`` of them; etcd sorts them
    itself and sends only those.
    """

    key: str
    prefix: bool = False
    values: bool = True
    limit: int | None = None
    descending: bool = False
    newest: bool = False


class TxnOutcome(Struct, frozen=True):
    """What :meth:`Store.txn_or_read` did.

    ``succeeded``: the writes were applied at ``revision``. Otherwise nothing
    was written, ``changed`` names the keys whose compare failed and
    ``reads`` holds one :class:`Listing` per requested :class:`Read`, in order.
    """

    succeeded: bool
    revision: int
    changed: tuple[str, ...] = ()
    reads: tuple[Listing, ...] = ()


def key_or_none(raw: bytes) -> str | None:
    """``raw`` as a key, or ``None`` when it is not UTF-8 text.

    Keys are decoded strictly: such a key was written by hand (``etcdctl put``,
    ``sqlite3``), names nothing allocator writes, and is skipped and reported
    by its readers, never a reason for a read to fail.
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def key_text(raw: bytes) -> str:
    """``raw`` as printable text, its bytes that are not UTF-8 escaped (``\\xff``)."""
    return raw.decode("utf-8", "backslashreplace")


def bad_key_records(listing: Listing) -> tuple[BadRecord, ...]:
    """One :class:`BadRecord` per key of ``listing`` that was skipped as not UTF-8 text."""
    return tuple(BadRecord(key, "the key is not UTF-8 text") for key in listing.bad_keys)


def txn_size(compares: Sequence[Compare], ops: Sequence[Op]) -> int:
    """How many operations a transaction counts against ``max_txn_ops``."""
    return len(compares) + len(ops)


@runtime_checkable
class Watch(Protocol):
    """A live subscription to changes under a prefix."""

    def next(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds; return the next batch of events.

        Returns an empty list when nothing happened in time. Raises
        ``StoreUnavailable`` if the connection broke and ``Compacted`` if the
        requested history is gone.
        """
        ...

    def close(self) -> None:
        """Stop watching and release resources. Idempotent."""
        ...


@runtime_checkable
class Store(Protocol):
    """A consistent key-value store with revisions, watches and leases.

    ``url`` is the store's URL with any password masked (safe to print);
    ``max_txn_ops`` is the most compares + writes one transaction may hold
    (``None``: no limit).
    """

    url: str
    max_txn_ops: int | None

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None`` if absent."""
        ...

    def list(self, prefix: str, *, limit: int | None = None, descending: bool = False) -> Listing:
        """Return every key starting with ``prefix`` (sorted) in one read.

        ``limit``: only the first ``limit`` keys; ``descending``: in
        descending key order (the newest first, where keys sort by time, as
        history entries do). Together they read the newest few of many keys
        at the cost of those few.
        """
        ...

    def put(
        self,
        key: str,
        value: bytes,
        *,
        expect_revision: int | None = None,
        lease: int | None = None,
    ) -> int:
        """Write ``key``; return the new store revision.

        With ``expect_revision`` the write is conditional (see module doc).
        """
        ...

    def delete(self, key: str, *, expect_revision: int | None = None) -> bool:
        """Delete ``key``; return whether it existed.

        With ``expect_revision`` the delete is conditional.
        """
        ...

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        """Apply ``ops`` atomically if every compare holds; return the revision.

        Raises ``CasConflict`` naming the failed keys otherwise; nothing is
        written then.
        """
        ...

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        """One :class:`Listing` per item of ``reads``, in one request where the backend can."""
        ...

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        """Like :meth:`txn`, but a failed compare returns ``reads`` instead of raising.

        Nothing is written then; the outcome names the failed keys.
        """
        ...

    def list_parts(
        self, prefix: str, revision: int, splits: Sequence[str] = ()
    ) -> Iterator[Listing]:
        """Every key under ``prefix`` as at ``revision``: one listing per part, in key order.

        The parts are ``prefix``'s key range cut at ``splits`` (those under
        it, sorted, each once). etcd reads them as key ranges at ``revision``,
        a few at once, each as soon as it is in, and raises ``Compacted`` if
        that revision is gone; the other stores read the prefix as it is now
        and cut it (:mod:`allocator.store.parts`).
        """
        ...

    def list_runs(self, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        """One listing per run: every key under each of its prefixes, as at ``revision``.

        A run's prefixes are in key order, none under another.

        etcd reads each run as one key range from its first prefix through
        its last, at ``revision`` (``Compacted`` if gone), and keeps the keys
        under the run's prefixes; the others read the prefixes in batches.
        """
        ...

    def list_pages(self, prefix: str, revision: int, page_keys: int) -> Iterator[Listing]:
        """Every key under ``prefix`` as at ``revision``, ``page_keys`` keys to a listing.

        etcd reads one range request per page at ``revision`` (``Compacted``
        if gone), each well within a call's budget; the others read the
        prefix as it is now, whole, and cut it.
        """
        ...

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Watch ``prefix`` for changes with revision >= ``start_revision``."""
        ...

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds; return its id."""
        ...

    def refresh_lease(self, lease: int) -> None:
        """Extend ``lease`` by its TTL; raise ``LeaseLost`` if it is gone."""
        ...

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys. No error if already gone."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...


def read_each(store: Store, reads: Sequence[Read]) -> tuple[Listing, ...]:
    """``read_many`` for a backend without batched reads: one get or list per item."""
    return tuple(_read_one(store, read) for read in reads)


def txn_then_read(
    store: Store, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
) -> TxnOutcome:
    """``txn_or_read`` for a backend whose failed transaction carries no reads: read after."""
    try:
        return TxnOutcome(True, store.txn(compares, ops))
    except CasConflict as exc:
        found = read_each(store, reads)
        revision = max((listing.revision for listing in found), default=0)
        return TxnOutcome(False, revision, exc.keys, found)


def _read_one(store: Store, read: Read) -> Listing:
    if read.prefix and read.newest:
        whole = store.list(read.key)
        items = sorted(whole.items, key=lambda kv: kv.mod_revision, reverse=True)[: read.limit]
        listing = Listing(tuple(items), whole.revision, whole.bad_keys)
    elif read.prefix:
        listing = store.list(read.key, limit=read.limit, descending=read.descending)
    else:
        item = store.get(read.key)
        # A single get reports no store revision; the item's own is the best bound.
        listing = Listing((item,) if item is not None else (), item.mod_revision if item else 0)
    if read.values:
        return listing
    bare = tuple(
        KeyValue(kv.key, b"", kv.mod_revision, kv.create_revision, kv.lease) for kv in listing.items
    )
    return Listing(bare, listing.revision, listing.bad_keys)
