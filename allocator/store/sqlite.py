"""The embedded store: one SQLite file, shared safely by processes on one host.

URL forms: ``sqlite://`` followed by a filesystem path, taken literally, so
``sqlite:///var/lib/allocator/store.db`` is the absolute path
``/var/lib/allocator/store.db`` and ``sqlite://state/store.db`` is relative
to the current directory (``~`` is expanded). Parent directories are created.

How the Store semantics are kept (see :mod:`allocator.store.base`):

* WAL mode lets readers run while one writer writes; every write runs in
  ``BEGIN IMMEDIATE`` so compare-and-write is one serialised step across
  processes, waiting up to ``busy_timeout`` for the write lock.
* A one-row ``meta`` table holds the global revision and the compaction
  point; the ``changes`` table logs every event for watches and keeps the
  last ``history`` revisions (older watches get ``Compacted``).
* A watch polls the revision every ``poll_interval`` seconds, sleeping in
  between, and reads only the new part of the log.
* Lease expiry times are wall-clock (``clock``, default ``time.time``)
  because several processes compare them; expired leases are reaped lazily
  by whichever process touches the store next, with delete events.

``sqlite3`` errors are translated into allocator errors here and only here.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from allocator.errors import (
    AllocatorError,
    LeaseLost,
    PermissionDenied,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from allocator.store import _local
from allocator.store.base import Compare, Delete, Event, KeyValue, Listing, Op, Put, Store, Watch

__all__ = ["SqliteStore", "open_sqlite", "path_of_url"]

Clock = Callable[[], float]
_Events = list[Event]  # spelled here: inside SqliteStore, `list` is a method
_SCHEME = "sqlite://"

# Primary SQLite result codes (extended codes keep these in the low byte).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 11, 13, 14
_SQLITE_NOTADB = 26


def path_of_url(url: str) -> Path:
    """Return the absolute database path a ``sqlite://`` URL names."""
    if not url.startswith(_SCHEME):
        raise StoreConfigError(f"not an SQLite store URL: {url!r} (expected sqlite:///path/to.db)")
    raw = url[len(_SCHEME) :]
    if not raw:
        raise StoreConfigError(f"SQLite store URL {url!r} names no file")
    return Path(raw).expanduser().absolute()


def translate(exc: sqlite3.Error, path: Path, doing: str) -> AllocatorError:
    """Map an ``sqlite3`` error to the allocator error a caller can act on."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    where = f"SQLite store {path}"
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreUnavailable(f"{where} stayed locked by another process while {doing}")
    if code in (_SQLITE_READONLY, _SQLITE_PERM):
        return PermissionDenied(f"{where} is read-only for this user: cannot {doing}")
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreError(f"{where} is corrupt or not an SQLite database ({exc})")
    if code == _SQLITE_CANTOPEN:
        return StoreConfigError(f"{where} cannot be opened ({exc})")
    if code in (_SQLITE_IOERR, _SQLITE_FULL):
        return StoreUnavailable(f"{where}: disk error while {doing} ({exc})")
    return StoreError(f"{where}: {doing} failed ({exc})")


_SCHEMA_VERSION = 1
_SCHEMA = (
    "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " revision INTEGER NOT NULL, compact_revision INTEGER NOT NULL)",
    "INSERT INTO meta (id, revision, compact_revision) VALUES (1, 0, 0)",
    "CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
    " mod_revision INTEGER NOT NULL, create_revision INTEGER NOT NULL, lease INTEGER)",
    "CREATE INDEX kv_by_lease ON kv (lease) WHERE lease IS NOT NULL",
    "CREATE TABLE changes (id INTEGER PRIMARY KEY, revision INTEGER NOT NULL,"
    " type TEXT NOT NULL CHECK (type IN ('put', 'delete')), key TEXT NOT NULL, value BLOB)",
    "CREATE INDEX changes_by_revision ON changes (revision)",
    "CREATE TABLE leases (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " ttl REAL NOT NULL, expires_at REAL NOT NULL)",
    "CREATE INDEX leases_by_expiry ON leases (expires_at)",
)


@contextmanager
def _transaction(conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    """Run the block in one transaction; roll back if it raises."""
    conn.execute(f"BEGIN {mode}")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """Open (creating if needed) the database at ``path`` with the current schema."""
    _ensure_parent(path)
    if path.is_dir():
        raise StoreConfigError(f"SQLite store {path} is a directory, not a database file")
    try:
        conn = sqlite3.connect(
            str(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise translate(exc, path, "opening it") from exc
    try:
        _ensure_schema(conn, path)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, path, "opening it") from exc
        raise
    return conn


def _ensure_parent(path: Path) -> None:
    """Create ``path``'s missing parent directories, or say which path is in the way."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is not a directory" if blocker else (exc.strerror or str(exc))
        raise StoreConfigError(
            f"cannot create the directory of SQLite store {path}: {reason}"
        ) from exc


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the schema in a new database; refuse a foreign or newer one.

    The common case (an existing store) costs one header read.
    """
    if _user_version(conn) == _SCHEMA_VERSION:
        return
    # Persistent in the file, and impossible inside a transaction: set it first.
    conn.execute("PRAGMA journal_mode = WAL")
    with _transaction(conn):
        # Re-read under the write lock: another process may have just created it.
        version = _user_version(conn)
        if version > _SCHEMA_VERSION:
            raise StoreError(
                f"SQLite store {path} has schema version {version}; this allocator "
                f"reads {_SCHEMA_VERSION} (upgrade allocator)"
            )
        if version == _SCHEMA_VERSION:
            return
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(f"{path} is an SQLite database but not an allocator store")
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


class SqliteStore(_local.ConditionalWrites):
    """A Store in one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        url: str | None = None,
        clock: Clock = time.time,
        history: int = _local.DEFAULT_HISTORY,
        poll_interval: float = 0.025,
        busy_timeout: float = 10.0,
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        self.url = url or f"{_SCHEME}{self.path}"
        self._clock = clock
        self._history = history
        self._poll_interval = poll_interval
        self._next_watch_reap = 0.0
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = _connect(self.path, busy_timeout)

    # --- plumbing ----------------------------------------------------------------

    @contextmanager
    def _session(self, doing: str) -> Iterator[sqlite3.Connection]:
        """Hold the connection for one operation, translating sqlite3 errors."""
        with self._lock:
            if self._conn is None:
                raise StoreUnavailable(f"SQLite store {self.path} is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise translate(exc, self.path, doing) from exc

    @staticmethod
    def _revisions(conn: sqlite3.Connection) -> tuple[int, int]:
        """Return (current revision, compact revision)."""
        row = conn.execute("SELECT revision, compact_revision FROM meta WHERE id = 1").fetchone()
        return int(row[0]), int(row[1])

    @staticmethod
    def _mod_revision_reader(conn: sqlite3.Connection) -> Callable[[str], int]:
        def mod_revision_of(key: str) -> int:
            row = conn.execute("SELECT mod_revision FROM kv WHERE key = ?", (key,)).fetchone()
            return int(row[0]) if row else 0

        return mod_revision_of

    def _commit_changes(self, conn: sqlite3.Connection, changes: Sequence[Op]) -> int:
        """Write ``changes`` at one new revision, log them, trim the log. In a txn."""
        revision = self._revisions(conn)[0] + 1
        for op in changes:
            if isinstance(op, Put):
                conn.execute(
                    "INSERT INTO kv (key, value, mod_revision, create_revision, lease)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET"
                    " value = excluded.value, mod_revision = excluded.mod_revision,"
                    " lease = excluded.lease",
                    (op.key, op.value, revision, revision, _local.lease_of(op.lease)),
                )
                conn.execute(
                    "INSERT INTO changes (revision, type, key, value) VALUES (?, 'put', ?, ?)",
                    (revision, op.key, op.value),
                )
            else:
                conn.execute("DELETE FROM kv WHERE key = ?", (op.key,))
                conn.execute(
                    "INSERT INTO changes (revision, type, key) VALUES (?, 'delete', ?)",
                    (revision, op.key),
                )
        horizon = revision - self._history
        conn.execute("DELETE FROM changes WHERE revision <= ?", (horizon,))
        conn.execute(
            "UPDATE meta SET revision = ?, compact_revision = max(compact_revision, ?)"
            " WHERE id = 1",
            (revision, horizon),
        )
        return revision

    def _end_lease(self, conn: sqlite3.Connection, lease_id: int) -> None:
        """Forget ``lease_id`` and delete its keys at one revision. In a txn."""
        conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))
        rows = conn.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease_id,))
        doomed = [Delete(str(row[0])) for row in rows.fetchall()]
        if doomed:
            self._commit_changes(conn, doomed)

    def _reap(self, conn: sqlite3.Connection) -> None:
        """End every expired lease. In a write txn."""
        rows = conn.execute(
            "SELECT id FROM leases WHERE expires_at <= ? ORDER BY expires_at, id",
            (self._clock(),),
        ).fetchall()
        for (lease_id,) in rows:
            self._end_lease(conn, int(lease_id))

    def _reap_if_due(self, conn: sqlite3.Connection) -> None:
        """Reap expired leases, taking the write lock only when one has expired."""
        due = conn.execute(
            "SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1", (self._clock(),)
        ).fetchone()
        if due:
            with _transaction(conn):
                self._reap(conn)

    # --- reads -----------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None`` if absent."""
        _local.check_key(key)
        with self._session(f"reading {key}") as conn:
            self._reap_if_due(conn)
            row = conn.execute(
                "SELECT key, value, mod_revision, create_revision, lease FROM kv WHERE key = ?",
                (key,),
            ).fetchone()
        return _key_value(row) if row else None

    def list(self, prefix: str) -> Listing:
        """Return every key starting with ``prefix`` (sorted) and the store revision."""
        _local.check_prefix(prefix)
        low, high = _local.prefix_range(prefix)
        with self._session(f"listing {prefix}") as conn:
            self._reap_if_due(conn)
            with _transaction(conn, "DEFERRED"):
                rows = conn.execute(
                    "SELECT key, value, mod_revision, create_revision, lease FROM kv"
                    " WHERE key >= ? AND key < ? ORDER BY key",
                    (low, high),
                ).fetchall()
                revision = self._revisions(conn)[0]
        return Listing(tuple(_key_value(r) for r in rows), revision)

    def changes_since(self, prefix: str, cursor: int) -> tuple[_Events, int]:
        """Return events under ``prefix`` from revision ``cursor`` on, and the next cursor.

        Raises ``Compacted`` if revision ``cursor`` is no longer in the log.
        """
        low, high = _local.prefix_range(prefix)
        with self._session(f"watching {prefix}") as conn:
            # A watch polls every few milliseconds; looking for expired leases once
            # a second is enough (TTLs are seconds).
            now = time.monotonic()
            if now >= self._next_watch_reap:
                self._next_watch_reap = now + 1.0
                self._reap_if_due(conn)
            # The common, quiet case: one cheap read and no transaction.
            if self._revisions(conn)[0] < cursor:
                return [], cursor
            with _transaction(conn, "DEFERRED"):
                revision, compact = self._revisions(conn)
                _local.check_not_compacted(cursor, compact, prefix)
                if revision < cursor:
                    return [], cursor
                rows = conn.execute(
                    "SELECT type, key, value, revision FROM changes WHERE revision >= ?"
                    " AND revision <= ? AND key >= ? AND key < ? ORDER BY id",
                    (cursor, revision, low, high),
                ).fetchall()
        events = [
            Event("put" if t == "put" else "delete", k, None if v is None else bytes(v), r)
            for t, k, v, r in rows
        ]
        return events, revision + 1

    # --- writes ----------------------------------------------------------------------

    def _apply(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        """Check and apply a write; return (store revision, number of keys changed)."""
        _local.check_txn(compares, ops)
        with self._session("writing") as conn, _transaction(conn):
            self._reap(conn)
            mod_revision_of = self._mod_revision_reader(conn)
            failed = _local.failed_compares(compares, mod_revision_of)
            if failed:
                raise _local.cas_conflict(compares, failed, mod_revision_of)
            self._check_leases(conn, ops)
            changes = [op for op in ops if isinstance(op, Put) or mod_revision_of(op.key)]
            if not changes:
                return self._revisions(conn)[0], 0
            return self._commit_changes(conn, changes), len(changes)

    @staticmethod
    def _check_leases(conn: sqlite3.Connection, ops: Sequence[Op]) -> None:
        for op in ops:
            lease = _local.lease_of(op.lease) if isinstance(op, Put) else None
            if lease is None:
                continue
            if not conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone():
                raise LeaseLost(f"cannot put {op.key}: lease {lease} has expired or was revoked")

    # --- watches and leases --------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Watch ``prefix`` for changes with revision >= ``start_revision`` (<= 0: from now)."""
        _local.check_prefix(prefix)
        current = 0
        if not isinstance(start_revision, int) or start_revision <= 0:
            with self._session(f"watching {prefix}") as conn:
                current = self._revisions(conn)[0]
        cursor = _local.resolve_start(start_revision, current)
        return _local.PollingWatch(
            lambda at: self.changes_since(prefix, at), cursor, self._poll_interval
        )

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds; return its id."""
        seconds = _local.check_ttl(ttl)
        with self._session("granting a lease") as conn, _transaction(conn):
            self._reap(conn)
            cursor = conn.execute(
                "INSERT INTO leases (ttl, expires_at) VALUES (?, ?)",
                (seconds, self._clock() + seconds),
            )
            return int(cursor.lastrowid or 0)

    def refresh_lease(self, lease: int) -> None:
        """Extend ``lease`` by its TTL; raise ``LeaseLost`` if it is gone."""
        with self._session(f"refreshing lease {lease}") as conn, _transaction(conn):
            self._reap(conn)
            updated = conn.execute(
                "UPDATE leases SET expires_at = ? + ttl WHERE id = ?", (self._clock(), lease)
            ).rowcount
        # Raised after the commit, so the reaping above is kept.
        if not updated:
            raise LeaseLost(f"lease {lease} has expired or was revoked")

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys. No error if already gone."""
        with self._session(f"revoking lease {lease}") as conn, _transaction(conn):
            self._reap(conn)
            self._end_lease(conn, lease)

    def close(self) -> None:
        """Close the database connection. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _key_value(row: tuple[Any, ...]) -> KeyValue:
    key, value, mod_revision, create_revision, lease = row
    return KeyValue(str(key), bytes(value), int(mod_revision), int(create_revision), lease)


def open_sqlite(url: str) -> Store:
    """Open the SQLite store ``url`` names (see the module docstring for URL forms)."""
    return SqliteStore(path_of_url(url), url=url)
