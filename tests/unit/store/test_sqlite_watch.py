"""The SQLite watch sleeps while nothing changes and wakes when the store's files do."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from allocator.store import Event, open_store
from allocator.store.sqlite.store import SqliteStore
from allocator.store.sqlite.watch import MAX_SLEEP_S, FileChanges, SqliteWatch, backoff
from tests.support.waiting import wait_for

_WRITE = """
import sys
from allocator.store import open_store
store = open_store(sys.argv[1])
store.put(sys.argv[2], b"from another process")
store.close()
"""


def counted(store: SqliteStore) -> list[int]:
    """Count the store reads the store's watches make (one per entry)."""
    reads: list[int] = []
    original = store.changes_since

    def changes_since(prefix: str, cursor: int) -> tuple[list[Event], int]:
        reads.append(cursor)
        return original(prefix, cursor)

    store.changes_since = changes_since  # type: ignore[method-assign]
    return reads


def test_an_idle_watch_reads_the_store_only_when_its_files_change(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}"
    writer = open_store(url, create=True)
    writer.put("/w/a", b"1")
    reader = open_store(url)
    assert isinstance(reader, SqliteStore)
    reads = counted(reader)
    watch = reader.watch("/w/", 0)
    try:
        assert watch.next(0.6) == []
        # Polling every 25 ms would have read ~24 times by now.
        assert len(reads) <= 2
        subprocess.run(
            [sys.executable, "-c", _WRITE, url, "/w/b"], check=True, capture_output=True, timeout=60
        )
        events = watch.next(10.0)
        assert [(e.key, e.value) for e in events] == [("/w/b", b"from another process")]
    finally:
        watch.close()
        reader.close()
        writer.close()


def test_close_wakes_a_watch_waiting_for_file_changes(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path / 'store.db'}", create=True)
    store.put("/w/a", b"1")
    watch = store.watch("/w/", 0)
    result: list[list[Event]] = []
    waiter = threading.Thread(target=lambda: result.append(watch.next(60.0)))
    waiter.start()
    watch.close()
    waiter.join(10)
    assert not waiter.is_alive() and result == [[]]
    store.close()


def test_without_inotify_a_watch_polls_and_still_delivers(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path / 'store.db'}", create=True)
    assert isinstance(store, SqliteStore)
    start = store.put("/w/a", b"1")
    watch = SqliteWatch(lambda at: store.changes_since("/w/", at), start, None, 0.01)
    try:
        assert [e.revision for e in watch.next(10.0)] == [start]
        later = store.put("/w/a", b"2")
        assert [e.revision for e in watch.next(10.0)] == [later]
    finally:
        watch.close()
        store.close()


def test_a_quiet_poll_backs_off_up_to_the_longest_sleep() -> None:
    intervals = [0.025]
    for _ in range(10):
        intervals.append(backoff(intervals[-1], 0.025))
    assert intervals[:4] == [0.025, 0.05, 0.1, 0.2]
    assert intervals[-1] == MAX_SLEEP_S


def test_a_store_in_a_missing_directory_is_watched_by_polling(tmp_path: Path) -> None:
    assert FileChanges.open(tmp_path / "missing" / "store.db") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_writes_to_other_files_in_the_directory_do_not_count(tmp_path: Path) -> None:
    changes = FileChanges.open(tmp_path / "store.db")
    assert changes is not None
    try:
        (tmp_path / "unrelated.txt").write_text("x")
        assert changes.wait(0.2) is False
        (tmp_path / "store.db-wal").write_bytes(b"x")
        assert changes.wait(10.0) is True
    finally:
        changes.close()


def test_a_commit_during_the_re_reads_after_an_unrelated_write_is_read_at_once(
    tmp_path: Path,
) -> None:
    # A write under another prefix (the agent's own records) wakes the watch and shows it
    # nothing, so it re-reads after short steps; a commit under its prefix landing during a
    # step must be delivered on its own file event, not after the step (here a minute).
    store = open_store(f"sqlite://{tmp_path / 'store.db'}", create=True)
    assert isinstance(store, SqliteStore)
    reads = counted(store)
    changes = FileChanges.open(store.path)
    assert changes is not None
    watch = SqliteWatch(
        lambda at: store.changes_since("/w/", at),
        store.put("/other/a", b"0") + 1,
        changes,
        0.025,
        settle=(60.0,),
    )
    result: list[list[Event]] = []
    waiter = threading.Thread(target=lambda: result.append(watch.next(120.0)))
    try:
        waiter.start()
        wait_for("the watch's first read", lambda: len(reads) >= 1)
        store.put("/other/b", b"1")
        wait_for("the watch to read after the unrelated write", lambda: len(reads) >= 2)
        store.put("/w/k", b"2")
        waiter.join(10)
        assert [(e.key, e.value) for e in result[0]] == [("/w/k", b"2")]
    finally:
        watch.close()
        waiter.join(10)
        store.close()
