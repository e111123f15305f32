"""The SQLite store's file: opening it read-only or read-write, its schema, its errors.

:class:`Connections` holds one store file's connections: reads use a
read-only connection (so a user who may only read the file can read, and a
read never creates anything); the first write switches to a read-write one,
creating the file and its schema when the mode allows. Private to
:mod:`allocator.store.sqlite.store`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from allocator.errors import (
    AllocatorError,
    PermissionDenied,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)

__all__ = ["Connections", "transaction", "translate"]

# Primary SQLite result codes (extended codes keep these in the low byte).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 11, 13, 14
_SQLITE_NOTADB = 26


def translate(exc: sqlite3.Error, path: Path, doing: str) -> AllocatorError:
    """Map an ``sqlite3`` error to the allocator error a caller can act on."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    where = f"SQLite store {path}"
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreUnavailable(f"{where} stayed locked by another process while {doing}")
    if code in (_SQLITE_READONLY, _SQLITE_PERM):
        return PermissionDenied(f"{where} is read-only for this user: cannot {doing}")
    if code == _SQLITE_NOTADB:
        return StoreConfigError(f"{where} is not an SQLite database (check --store)")
    if code == _SQLITE_CORRUPT:
        return StoreUnavailable(f"{where} is corrupt ({exc}); restore it from a backup")
    if code == _SQLITE_CANTOPEN:
        return StoreUnavailable(f"{where} cannot be opened ({exc})")
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
def transaction(conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
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


def _connect_read_only(path: Path, busy_timeout: float) -> tuple[sqlite3.Connection | None, bool]:
    """Open ``path`` read-only: (connection or ``None`` if it holds no store yet, immutable).

    Reading a WAL database needs its ``-shm`` index, which a user who may
    only read cannot create. While a writer is connected (or after one
    crashed) the index exists and a plain read-only open works; when the
    last writer closed cleanly there is no ``-wal`` file, so the main file
    is the whole store and it is opened ``immutable`` instead (for one read
    at a time: an immutable connection would not notice a later write).
    """
    if path.is_dir():
        raise StoreConfigError(f"SQLite store {path} is a directory, not a database file")
    try:
        return _open_read_only(path, busy_timeout, immutable=False), False
    except sqlite3.Error as exc:
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        no_log = not Path(f"{path}-wal").exists()
        if code not in (_SQLITE_READONLY, _SQLITE_PERM, _SQLITE_CANTOPEN) or not no_log:
            raise translate(exc, path, "opening it") from exc
    try:
        return _open_read_only(path, busy_timeout, immutable=True), True
    except sqlite3.Error as exc:
        raise translate(exc, path, "opening it") from exc


def _open_read_only(path: Path, busy_timeout: float, immutable: bool) -> sqlite3.Connection | None:
    uri = f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(
        uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    try:
        # One statement, so one snapshot: read apart, a store created in between
        # would show its tables without its version, and look foreign.
        version, objects = conn.execute(
            "SELECT (SELECT user_version FROM pragma_user_version),"
            " (SELECT count(*) FROM sqlite_master)"
        ).fetchone()
        if version > _SCHEMA_VERSION:
            raise _newer_schema(path, version)
        if version < _SCHEMA_VERSION:
            if objects:
                raise _foreign(path)
            conn.close()
            return None
    except BaseException:
        conn.close()
        raise
    return conn


def _newer_schema(path: Path, version: int) -> StoreError:
    return StoreError(
        f"SQLite store {path} has schema version {version}; this allocator "
        f"reads {_SCHEMA_VERSION} (upgrade allocator)"
    )


def _foreign(path: Path) -> StoreConfigError:
    return StoreConfigError(f"{path} is an SQLite database but not an allocator store")


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
    with _creators_take_turns(path):
        _create_schema(conn, path)


@contextmanager
def _creators_take_turns(path: Path) -> Iterator[None]:
    """Let one process at a time create the store.

    Switching a new file to WAL needs an exclusive lock, and SQLite answers
    "database is locked" at once (without waiting out the busy timeout) when
    another connection is creating the same file. ``flock`` is independent of
    SQLite's own POSIX locks on Linux, so it serialises creators only.
    """
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _create_schema(conn: sqlite3.Connection, path: Path) -> None:
    # Another process may have created it while this one waited for its turn.
    if _user_version(conn) == _SCHEMA_VERSION:
        return
    # Persistent in the file, and impossible inside a transaction: set it first.
    conn.execute("PRAGMA journal_mode = WAL")
    with transaction(conn):
        version = _user_version(conn)
        if version > _SCHEMA_VERSION:
            raise _newer_schema(path, version)
        if version == _SCHEMA_VERSION:
            return
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise _foreign(path)
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a path the system cannot even look up is a config error."""
    try:
        return path.exists()
    except OSError as exc:
        raise StoreConfigError(f"SQLite store path {path}: {exc.strerror or exc}") from None


class Connections:
    """One store file's connections: read-only until the first write (see the module doc).

    ``mode``: ``ro`` never writes; ``rw`` writes but never creates the
    file; ``rwc`` creates it on the first write. A read of a missing file
    is ``StoreUnavailable`` naming it, unless ``missing_is_empty`` (the
    caller is about to create the store): then it reads as an empty store.
    Not thread-safe: the store serialises calls.
    """

    def __init__(
        self, path: Path, mode: str, busy_timeout: float, *, missing_is_empty: bool = False
    ) -> None:
        self.path = path
        self.mode = mode
        self.missing_is_empty = missing_is_empty
        self._busy_timeout = busy_timeout
        self._ro: sqlite3.Connection | None = None
        self._ro_immutable = False
        self._rw: sqlite3.Connection | None = None
        self.closed = False
        if _exists(path):  # a bad file is reported when the store is opened
            self._open_reader()

    @property
    def writable(self) -> bool:
        """Whether a read-write connection is open (this handle has written)."""
        return self._rw is not None

    def reader(self) -> sqlite3.Connection | None:
        """A connection to read with; ``None`` while a store to be created does not exist yet."""
        self._check_open()
        if self._rw is not None:
            return self._rw
        if self._ro_immutable or (self._ro is None and _exists(self.path)):
            self._open_reader()
        if self._ro is None and not self.missing_is_empty:
            raise self._missing()
        return self._ro

    def writer(self) -> sqlite3.Connection:
        """The read-write connection, opened (and the store created, in ``rwc``) on first use."""
        self._check_open()
        if self._rw is not None:
            return self._rw
        if self.mode == "ro":
            raise PermissionDenied(
                f"SQLite store {self.path} was opened read-only (mode=ro): cannot write"
            )
        if self.mode == "rw" and not _exists(self.path):
            raise self._missing()
        self._rw = _connect(self.path, self._busy_timeout)
        if self._ro is not None:
            self._ro.close()
            self._ro = None
        return self._rw

    def _open_reader(self) -> None:
        if self._ro is not None:
            self._ro.close()
        self._ro, self._ro_immutable = _connect_read_only(self.path, self._busy_timeout)

    def close(self) -> None:
        """Close both connections. Idempotent."""
        self.closed = True
        for conn in (self._ro, self._rw):
            if conn is not None:
                conn.close()
        self._ro = self._rw = None

    def _check_open(self) -> None:
        if self.closed:
            raise StoreUnavailable(f"SQLite store {self.path} is closed")

    def _missing(self) -> StoreUnavailable:
        state = "holds no store yet" if self.path.exists() else "does not exist"
        return StoreUnavailable(
            f"SQLite store {self.path} {state}: check --store / ALLOCATOR_STORE "
            "(`allocator policy apply FILE` creates it)"
        )
