"""The SQLite store's own concerns: URLs, files, schema, locking and error translation."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.errors import (
    PermissionDenied,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from allocator.store import open_store
from allocator.store.sqlite import database as sqlite_db
from allocator.store.sqlite.store import SqliteStore, path_of_url, translate


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(db)
    try:
        yield s
    finally:
        s.close()


# --- URLs and paths ----------------------------------------------------------------


def test_three_slashes_name_an_absolute_path() -> None:
    assert path_of_url("sqlite:///tmp/x.db") == Path("/tmp/x.db")


def test_two_slashes_and_a_relative_path_are_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    s = open_store("sqlite://state/store.db")
    s.put("/k", b"v")
    s.close()

    assert (tmp_path / "state" / "store.db").is_file()


def test_a_tilde_is_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert path_of_url("sqlite://~/s.db") == tmp_path / "s.db"


@pytest.mark.parametrize("url", ["sqlite://", "memory://x", "sqlite:/x.db"])
def test_a_url_without_a_file_is_a_config_error(url: str) -> None:
    with pytest.raises(StoreConfigError):
        path_of_url(url)


def test_the_first_write_creates_the_file_and_missing_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c" / "store.db"

    s = open_store(f"sqlite://{target}")
    assert not (tmp_path / "a").exists()  # opening creates nothing
    s.put("/k", b"v")
    s.close()

    assert target.is_file()
    assert s.url == f"sqlite://{target}"


def test_a_parent_that_is_a_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    target = blocker / "store.db"

    store = open_store(f"sqlite://{target}")
    with pytest.raises(StoreConfigError, match=f"{target}: {blocker} is not a directory"):
        store.put("/k", b"v")


def test_a_path_that_is_a_directory_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match=f"{tmp_path}.*directory"):
        open_store(f"sqlite://{tmp_path}")


# --- the file and its schema ------------------------------------------------------


def test_a_file_that_is_not_a_database_is_a_config_error_naming_it(db: Path) -> None:
    db.write_bytes(b"this is not a database at all, just some bytes" * 100)

    with pytest.raises(StoreConfigError, match=str(db)) as caught:
        SqliteStore(db)

    assert not isinstance(caught.value, sqlite3.Error)
    assert db.read_bytes().startswith(b"this is not a database")


def test_a_foreign_sqlite_database_is_refused_and_left_alone(db: Path) -> None:
    foreign = sqlite3.connect(db)
    foreign.execute("CREATE TABLE mine (x)")
    foreign.commit()
    foreign.close()

    with pytest.raises(StoreConfigError, match="not an allocator store"):
        SqliteStore(db)

    check = sqlite3.connect(db)
    tables = check.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    check.close()
    assert tables == [("mine",)]


def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteStore(db).close()
    newer = sqlite3.connect(db)
    newer.execute("PRAGMA user_version = 99")
    newer.close()

    with pytest.raises(StoreError, match="upgrade allocator"):
        SqliteStore(db)


def test_the_database_is_in_wal_mode_with_a_schema_version(store: SqliteStore, db: Path) -> None:
    store.put("/k", b"v")
    check = sqlite3.connect(db)
    mode = check.execute("PRAGMA journal_mode").fetchone()[0]
    version = check.execute("PRAGMA user_version").fetchone()[0]
    check.close()
    assert (mode, version) == ("wal", 1)


def test_reopening_keeps_data_and_revisions(db: Path) -> None:
    first = SqliteStore(db)
    written = first.put("/k", b"v")
    first.close()

    second = SqliteStore(db)
    got = second.get("/k")
    next_revision = second.put("/other", b"x")
    second.close()

    assert got is not None and got.mod_revision == written
    assert next_revision == written + 1


# --- locking ----------------------------------------------------------------------------


def _hold_write_lock(db: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_reads_and_watches_proceed_while_another_writer_holds_the_lock(
    store: SqliteStore, db: Path
) -> None:
    written = store.put("/k", b"v")
    watch = store.watch("/", written)
    holder = _hold_write_lock(db)
    try:
        got = store.get("/k")
        listing = store.list("/")
        events = watch.next(0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        watch.close()

    assert got is not None and got.value == b"v"
    assert listing.revision == written
    assert [e.revision for e in events] == [written]


def test_a_write_lock_held_past_the_busy_timeout_is_unavailable(db: Path) -> None:
    impatient = SqliteStore(db, busy_timeout=0.05)
    holder = _hold_write_lock(db)
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            impatient.put("/k", b"v")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # Nothing half-done is left behind: the store works once the lock is free.
    assert impatient.put("/k", b"v") > 0
    impatient.close()


def test_a_read_only_database_error_becomes_permission_denied(store: SqliteStore, db: Path) -> None:
    store.put("/k", b"v")
    read_only = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.Error) as caught:
            read_only.execute("INSERT INTO leases (ttl, expires_at) VALUES (1, 1)")
    finally:
        read_only.close()

    translated = translate(caught.value, db, "writing")

    assert isinstance(translated, PermissionDenied)
    assert str(db) in str(translated)


class _Rows:
    """A statement's rows, read to the end."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows


class _CreatedAfterFirstStatement:
    """A read-only connection during whose open another process creates the store."""

    def __init__(self, conn: sqlite3.Connection, create: Callable[[], None]) -> None:
        self._conn, self._create = conn, create

    def execute(self, sql: str, *args: object) -> _Rows:
        rows = _Rows(self._conn.execute(sql, *args).fetchall())  # this statement's read ends
        create, self._create = self._create, lambda: None
        create()  # after this statement, before the next one
        return rows

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def test_a_store_created_while_a_reader_opens_it_is_never_called_foreign(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.touch()  # the creator's file, still empty
    creator = SqliteStore(db)
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> object:
        conn = real_connect(*args, **kwargs)
        if not kwargs.get("uri"):  # the creator's own (read-write) connection
            return conn
        return _CreatedAfterFirstStatement(conn, lambda: creator.put("/k", b"v"))

    monkeypatch.setattr(sqlite_db.sqlite3, "connect", connect)
    reader = SqliteStore(db)
    try:
        found = reader.get("/k")  # before the creation (nothing) or after it: never foreign
        assert found is None or found.value == b"v"
    finally:
        monkeypatch.undo()
        reader.close()
    assert SqliteStore(db).get("/k") is not None
    creator.close()
