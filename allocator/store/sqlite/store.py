"""The embedded store: one SQLite file, shared safely by processes on one host.

URL forms: ``sqlite://`` followed by a filesystem path, taken literally, so
``sqlite:///var/lib/allocator/store.db`` is the absolute path
``/var/lib/allocator/store.db`` and ``sqlite://state/store.db`` is relative
to the current directory (``~`` is expanded). ``?mode=ro`` (never write),
``?mode=rw`` (write, but never create) and ``?mode=rwc`` (create on the
first write) are SQLite's own modes; see :mod:`allocator.store.urls`.

Only a write creates the file (and its parent directories): a read of a
missing store is ``StoreUnavailable`` naming the path, so a mistyped path
is reported instead of answered with an empty fleet, unless the store was
opened to be created (``create=True``: ``policy apply``), in which case it
reads as empty until the first write, and a command that fails before
writing leaves nothing behind. Reads open the file read-only, so a
user who may only read the file can run every read command.

How the Store semantics are kept (see :mod:`allocator.store.base`):

* WAL mode lets readers run while one writer writes; every write runs in
  ``BEGIN IMMEDIATE`` so compare-and-write is one serialised step across
  processes, waiting up to ``busy_timeout`` for the write lock.
* A one-row ``meta`` table holds the global revision and the compaction
  point; the ``changes`` table logs every event for watches and keeps the
  last ``history`` revisions (older watches get ``Compacted``).
* A watch reads the revision only when the store's files change (``inotify``;
  elsewhere it polls, every ``poll_interval`` seconds after a change and
  less often while nothing happens) and reads only the new part of the log
  (see :mod:`allocator.store.sqlite.watch`).
* Lease expiry times are on the host's lease clock (``clock``, default
  :func:`~allocator.store.sqlite.lease_clock.lease_clock`: the same in
  every process, never stepped; a lease of an earlier boot is over). Reads
  leave out keys whose lease has expired without writing anything; writers
  (any write, and a watch of a handle that has written) reap expired
  leases, with delete events.

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

from allocator.errors import LeaseLost
from allocator.store import local
from allocator.store.base import (
    Compare,
    Delete,
    Event,
    KeyValue,
    Listing,
    Op,
    Put,
    Store,
    Watch,
    key_or_none,
    key_text,
)
from allocator.store.sqlite.database import Connections, transaction, translate
from allocator.store.sqlite.lease_clock import EXPIRED, LIVE, lease_clock
from allocator.store.sqlite.watch import FileChanges, SqliteWatch
from allocator.store.urls import parse_sqlite_url, redact_url

__all__ = ["SqliteStore", "open_sqlite", "path_of_url", "translate"]

Clock = Callable[[], float]
_Events = list[Event]  # spelled here: inside SqliteStore, `list` is a method
_SCHEME = "sqlite://"
# A key is visible while it has no lease or its lease has not expired.
_VISIBLE = (
    f"(kv.lease IS NULL OR EXISTS (SELECT 1 FROM leases WHERE leases.id = kv.lease AND {LIVE}))"
)
# The key as bytes: a key written by hand (``sqlite3``) may not be UTF-8 text, and
# sqlite3 would fail the whole read decoding it; such a key is skipped and reported.
_COLUMNS = "CAST(kv.key AS BLOB), kv.value, kv.mod_revision, kv.create_revision, kv.lease"


def path_of_url(url: str) -> Path:
    """Return the absolute database path a ``sqlite://`` URL names."""
    return parse_sqlite_url(url).path


class SqliteStore(local.ConditionalWrites):
    """A Store in one SQLite file (see the module docstring).

    ``mode`` is ``ro``, ``rw`` or ``rwc`` (the default: the first write
    creates the file). ``missing_is_empty`` (the default here; the URL
    opener, :func:`open_sqlite`, defaults to the opposite): reads of a file
    that does not exist yet see an empty store instead of failing.
    """

    max_txn_ops: int | None = None

    def __init__(
        self,
        path: str | Path,
        *,
        url: str | None = None,
        clock: Clock = lease_clock,
        history: int = local.DEFAULT_HISTORY,
        poll_interval: float = 0.025,
        busy_timeout: float = 10.0,
        mode: str = "rwc",
        missing_is_empty: bool = True,
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        self.url = redact_url(url or f"{_SCHEME}{self.path}")
        self._clock = clock
        self._history = history
        self._poll_interval = poll_interval
        self._next_watch_reap = 0.0
        self._lock = threading.RLock()
        self._files = Connections(self.path, mode, busy_timeout, missing_is_empty=missing_is_empty)

    # --- plumbing ----------------------------------------------------------------

    @contextmanager
    def _reading(self, doing: str) -> Iterator[sqlite3.Connection | None]:
        """A connection to read with (``None``: no store yet, read as empty)."""
        with self._lock:
            try:
                yield self._files.reader()
            except sqlite3.Error as exc:
                raise translate(exc, self.path, doing) from exc

    @contextmanager
    def _writing(self, doing: str) -> Iterator[sqlite3.Connection]:
        """The read-write connection, inside one write transaction."""
        with self._lock:
            try:
                conn = self._files.writer()
                with transaction(conn):
                    yield conn
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

    @staticmethod
    def _keys_under(conn: sqlite3.Connection) -> Callable[[str], list[str]]:
        def keys_under(prefix: str) -> list[str]:
            rows = conn.execute(
                "SELECT key FROM kv WHERE key >= ? AND substr(key, 1, ?) = ? ORDER BY key",
                (prefix, len(prefix), prefix),
            )
            return [str(row[0]) for row in rows.fetchall()]

        return keys_under

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
                    (op.key, op.value, revision, revision, local.lease_of(op.lease)),
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
            f"SELECT id FROM leases WHERE {EXPIRED} ORDER BY expires_at, id", self._now_twice()
        ).fetchall()
        for (lease_id,) in rows:
            self._end_lease(conn, int(lease_id))

    def _now_twice(self) -> tuple[float, float]:  # LIVE and EXPIRED take it twice
        now = self._clock()
        return now, now

    # --- reads -----------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """Return the current version of ``key``, or ``None`` if absent (or its lease expired)."""
        local.check_key(key)
        with self._reading(f"reading {key}") as conn:
            if conn is None:
                return None
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM kv WHERE kv.key = ? AND {_VISIBLE}",
                (key, *self._now_twice()),
            ).fetchone()
        return _key_value(row) if row else None

    def list(self, prefix: str, *, limit: int | None = None, descending: bool = False) -> Listing:
        """Every key starting with ``prefix`` (sorted; ``limit``, ``descending``: see Store)."""
        local.check_prefix(prefix)
        order = "DESC" if descending else "ASC"
        checked = local.check_limit(limit)
        cut = -1 if checked is None else checked  # -1: no limit
        with self._reading(f"listing {prefix}") as conn:
            if conn is None:
                return Listing((), 0)
            with transaction(conn, "DEFERRED"):
                rows = _prefix_rows(conn, prefix, self._now_twice(), order, cut)
                revision = self._revisions(conn)[0]
        return _listing(rows, revision)

    def list_runs(self, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        """Every key under each run's prefixes as it is now: one read transaction a run.

        One query a prefix inside it (a host's ``jobs/`` of thousands of
        hosts is a few milliseconds, not a transaction each).
        """
        for run in runs:
            yield self._list_run(run)

    def _list_run(self, run: Sequence[str]) -> Listing:
        for prefix in run:
            local.check_prefix(prefix)
        with self._reading(f"listing {len(run)} prefixes") as conn:
            if conn is None:
                return Listing((), 0)
            rows: list[tuple[Any, ...]] = []
            with transaction(conn, "DEFERRED"):
                now_twice = self._now_twice()
                for prefix in run:
                    rows += _prefix_rows(conn, prefix, now_twice)
                revision = self._revisions(conn)[0]
        return _listing(rows, revision)

    def changes_since(self, prefix: str, cursor: int) -> tuple[_Events, int]:
        """Return events under ``prefix`` from revision ``cursor`` on, and the next cursor.

        Raises ``Compacted`` if revision ``cursor`` is no longer in the log.
        """
        low, high = local.prefix_range(prefix)
        self._reap_if_due()
        with self._reading(f"watching {prefix}") as conn:
            # The common, quiet case: one cheap read and no transaction.
            if conn is None or self._revisions(conn)[0] < cursor:
                return [], cursor
            with transaction(conn, "DEFERRED"):
                revision, compact = self._revisions(conn)
                local.check_not_compacted(cursor, compact, prefix)
                if revision < cursor:
                    return [], cursor
                rows = conn.execute(
                    "SELECT type, CAST(key AS BLOB), value, revision FROM changes"
                    " WHERE revision >= ? AND revision <= ? AND key >= ? AND key < ? ORDER BY id",
                    (cursor, revision, low, high),
                ).fetchall()
        events = [
            Event("put" if t == "put" else "delete", key, None if v is None else bytes(v), r)
            for t, k, v, r in rows
            if (key := key_or_none(bytes(k))) is not None  # the next listing reports it
        ]
        return events, revision + 1

    def _reap_if_due(self) -> None:
        """From a watch of a handle that writes: end expired leases, once a second at most.

        Reads never write (a read-only user must be able to read); expiry
        events come from writers, so a watch reaps only on a handle that has
        written, and only when a lease has expired.
        """
        now = time.monotonic()
        if not self._files.writable or now < self._next_watch_reap:
            return
        self._next_watch_reap = now + 1.0  # TTLs are seconds; a watch polls in milliseconds
        with self._reading("looking for expired leases") as conn:
            due = (
                conn is not None
                and conn.execute(
                    f"SELECT 1 FROM leases WHERE {EXPIRED} LIMIT 1", self._now_twice()
                ).fetchone()
            )
        if due:
            with self._writing("ending expired leases") as conn:
                self._reap(conn)

    # --- writes ----------------------------------------------------------------------

    def _apply(self, compares: Sequence[Compare], ops: Sequence[Op]) -> tuple[int, int]:
        """Check and apply a write; return (store revision, number of keys changed)."""
        local.check_txn(compares, ops, self.max_txn_ops)
        with self._writing("writing") as conn:
            self._reap(conn)
            mod_revision_of = self._mod_revision_reader(conn)
            failed = local.failed_compares(compares, mod_revision_of)
            if failed:
                raise local.cas_conflict(compares, failed, mod_revision_of)
            self._check_leases(conn, ops)
            changes = local.expand_deletes(ops, mod_revision_of, self._keys_under(conn))
            if not changes:
                return self._revisions(conn)[0], 0
            return self._commit_changes(conn, changes), len(changes)

    @staticmethod
    def _check_leases(conn: sqlite3.Connection, ops: Sequence[Op]) -> None:
        for op in ops:
            lease = local.lease_of(op.lease) if isinstance(op, Put) else None
            if lease is None:
                continue
            if not conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone():
                raise LeaseLost(f"cannot put {op.key}: lease {lease} has expired or was revoked")

    # --- watches and leases --------------------------------------------------------

    def watch(self, prefix: str, start_revision: int) -> Watch:
        """Watch ``prefix`` for changes with revision >= ``start_revision`` (<= 0: from now)."""
        local.check_prefix(prefix)
        current = 0
        if not isinstance(start_revision, int) or start_revision <= 0:
            with self._reading(f"watching {prefix}") as conn:
                current = self._revisions(conn)[0] if conn is not None else 0
        cursor = local.resolve_start(start_revision, current)
        return SqliteWatch(
            lambda at: self.changes_since(prefix, at),
            cursor,
            FileChanges.open(self.path),
            self._poll_interval,
        )

    def grant_lease(self, ttl: float) -> int:
        """Create a lease of ``ttl`` seconds; return its id."""
        seconds = local.check_ttl(ttl)
        with self._writing("granting a lease") as conn:
            self._reap(conn)
            cursor = conn.execute(
                "INSERT INTO leases (ttl, expires_at) VALUES (?, ?)",
                (seconds, self._clock() + seconds),
            )
            return int(cursor.lastrowid or 0)

    def refresh_lease(self, lease: int) -> None:
        """Extend ``lease`` by its TTL; raise ``LeaseLost`` if it is gone."""
        with self._writing(f"refreshing lease {lease}") as conn:
            self._reap(conn)
            updated = conn.execute(
                "UPDATE leases SET expires_at = ? + ttl WHERE id = ?", (self._clock(), lease)
            ).rowcount
        # Raised after the commit, so the reaping above is kept.
        if not updated:
            raise LeaseLost(f"lease {lease} has expired or was revoked")

    def revoke_lease(self, lease: int) -> None:
        """End ``lease`` now, deleting its keys. No error if already gone."""
        with self._writing(f"revoking lease {lease}") as conn:
            self._reap(conn)
            self._end_lease(conn, lease)

    def close(self) -> None:
        """Close the database connections. Idempotent."""
        with self._lock:
            self._files.close()


def _prefix_rows(
    conn: sqlite3.Connection,
    prefix: str,
    now_twice: tuple[float, float],
    order: str = "ASC",
    cut: int = -1,
) -> list[tuple[Any, ...]]:
    """The live rows under ``prefix``, in key ``order``, ``cut`` at most (-1: all)."""
    low, high = local.prefix_range(prefix)
    return conn.execute(
        f"SELECT {_COLUMNS} FROM kv WHERE kv.key >= ? AND kv.key < ?"
        f" AND {_VISIBLE} ORDER BY kv.key {order} LIMIT ?",
        (low, high, *now_twice, cut),
    ).fetchall()


def _key_value(row: tuple[Any, ...]) -> KeyValue:
    key, value, mod_revision, create_revision, lease = row
    text = bytes(key).decode("utf-8")  # a get finds only the (valid) key it asked for
    return KeyValue(text, bytes(value), int(mod_revision), int(create_revision), lease)


def _listing(rows: list[tuple[Any, ...]], revision: int) -> Listing:
    """The listing of ``rows``; keys that are not UTF-8 in ``bad_keys``."""
    items: list[KeyValue] = []
    bad: list[str] = []
    for row in rows:
        if key_or_none(bytes(row[0])) is None:
            bad.append(key_text(bytes(row[0])))
        else:
            items.append(_key_value(row))
    return Listing(tuple(items), revision, tuple(bad))


def open_sqlite(url: str, *, create: bool = False) -> Store:
    """Open the SQLite store ``url`` names (see the module docstring for URL forms).

    The first write creates a missing file (unless the URL says
    ``mode=ro`` or ``mode=rw``); a read of a missing file is
    ``StoreUnavailable`` naming it, unless ``create`` (the caller is about to
    create the store), when it reads as empty.
    """
    parsed = parse_sqlite_url(url)
    return SqliteStore(parsed.path, url=url, mode=parsed.mode or "rwc", missing_is_empty=create)
