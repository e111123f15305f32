"""etcd-specific behaviour against a real etcd: outages, compaction, bounded errors.

The same-for-every-backend semantics live in tests/contract; these are the
things only etcd has (a server that goes away and comes back, compaction,
several endpoints, one range read for a whole listing).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from allocator.errors import AmbiguousWrite, Compacted, StoreError, StoreUnavailable
from allocator.store import Event, Put, Store, Watch, open_store
from allocator.store.etcd.rules import attempt_timeout
from tests.support.etcd_server import EtcdNotAvailable, EtcdServer, free_port
from tests.support.waiting import wait_for

# Hang guards, not timings: a dead endpoint must answer well inside them.
UNAVAILABLE_BOUND_S = 10.0
DEADLINE_S = 20.0
_T = TypeVar("_T")


#: Opens an etcd store (``connect(url)``).
Connect = Callable[[str], Store]


@pytest.fixture
def connect() -> Connect:
    """How every caller opens an etcd store."""
    return open_store


def poll(attempt: Callable[[], _T], deadline_s: float = DEADLINE_S) -> _T:
    """Call ``attempt`` until it stops raising StoreUnavailable; return its result."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return attempt()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def next_until_error(watch: Watch, deadline_s: float = DEADLINE_S) -> BaseException:
    """Call ``next`` until it raises; return what it raised (fail at the deadline)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            watch.next(0.5)
        except Exception as exc:
            return exc
    pytest.fail(f"watch.next() did not raise within {deadline_s} s")


def collect(watch: Watch, count: int, deadline_s: float = DEADLINE_S) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + deadline_s
    while len(events) < count and time.monotonic() < deadline:
        events.extend(watch.next(0.5))
    return events


@pytest.fixture
def store(etcd_server: EtcdServer, connect: Connect) -> Iterator[Store]:
    s = connect(etcd_server.url)
    yield s
    s.close()


# --- unreachable endpoints ------------------------------------------------------


def test_a_refused_endpoint_is_unavailable_quickly_and_named(connect: Connect) -> None:
    port = free_port()
    store = connect(f"etcd://127.0.0.1:{port}")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            store.get("/k")
        assert time.monotonic() - started < UNAVAILABLE_BOUND_S
        assert f"127.0.0.1:{port}" in str(caught.value)
        with pytest.raises(StoreUnavailable):
            store.watch("/k/", 1)
    finally:
        store.close()


def test_a_silent_endpoint_is_unavailable_within_a_bound(connect: Connect) -> None:
    # Accepts TCP connections (the kernel does) but never speaks HTTP/2.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        store = connect(f"etcd://127.0.0.1:{port}")
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                store.put("/k", b"v")
            assert time.monotonic() - started < UNAVAILABLE_BOUND_S
            assert f"127.0.0.1:{port}" in str(caught.value)
        finally:
            store.close()


def test_a_dead_first_endpoint_fails_over_to_the_next(
    etcd_server: EtcdServer, connect: Connect
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = connect(f"etcd://{dead},{etcd_server.endpoint}")
    try:
        revision = store.put("/failover/k", b"v")
        got = store.get("/failover/k")
        assert got is not None and got.mod_revision == revision
    finally:
        store.close()


def test_all_endpoints_dead_names_every_endpoint(connect: Connect) -> None:
    first, second = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    store = connect(f"etcd://{first},{second}")
    try:
        with pytest.raises(StoreUnavailable) as caught:
            store.list("/x/")
        assert first in str(caught.value) and second in str(caught.value)
    finally:
        store.close()


# --- one connection, one range read ------------------------------------------------


def test_list_of_a_big_cluster_is_one_range_request(
    store: Store, etcd_server: EtcdServer, prefix: str
) -> None:
    hosts, gpus = 1000, 8
    keys = [f"{prefix}/hosts/node{h:04d}/gpus/{g}" for h in range(hosts) for g in range(gpus)]
    value = b'{"schema_version": 1, "job": "train", "mode": "exclusive"}'
    for start in range(0, len(keys), 100):  # etcd allows 128 ops per txn
        store.txn([], [Put(k, value) for k in keys[start : start + 100]])
    before = etcd_server.requests_served("Range")

    listing = store.list(f"{prefix}/hosts/")

    assert etcd_server.requests_served("Range") == before + 1
    assert [kv.key for kv in listing.items] == sorted(keys)


def test_close_ends_the_store_threads_and_open_watches(
    etcd_server: EtcdServer, connect: Connect
) -> None:
    store = connect(etcd_server.url)
    watch = store.watch("/closing/", 1)
    before = {t for t in threading.enumerate() if t.name.startswith("allocator-etcd")}
    assert before  # the watch's reader thread

    store.close()
    store.close()

    with pytest.raises(StoreError, match="closed"):
        watch.next(1)
    with pytest.raises(StoreError, match="closed"):
        store.get("/closing/k")
    wait_for("the store's threads to end", lambda: not any(t.is_alive() for t in before))


# --- compaction --------------------------------------------------------------------


def test_a_watch_from_a_compacted_revision_raises_compacted(
    etcd_server_private: EtcdServer, connect: Connect
) -> None:
    store = connect(etcd_server_private.url)
    try:
        first = store.put("/c/k", b"1")
        store.put("/c/k", b"2")
        latest = store.put("/c/k", b"3")
        etcd_server_private.etcdctl("compact", str(latest))

        watch = store.watch("/c/", first)
        try:
            error = next_until_error(watch)
        finally:
            watch.close()

        assert isinstance(error, Compacted)
        assert error.compact_revision == latest
        # What an agent does next: re-read, then watch from the read's revision + 1.
        listing = store.list("/c/")
        resumed = store.watch("/c/", listing.revision + 1)
        try:
            later = store.put("/c/k", b"4")
            assert [e.revision for e in collect(resumed, 1)] == [later]
        finally:
            resumed.close()
    finally:
        store.close()


# --- outages -----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_watch_raises_when_etcd_goes_away_and_resumes_after_restart(
    etcd_server_private: EtcdServer, how: str, connect: Connect
) -> None:
    server = etcd_server_private
    store = connect(server.url)
    writer = connect(server.url)
    try:
        first = store.put("/o/a", b"1")
        watch = store.watch("/o/", first)
        seen = collect(watch, 1)
        assert [e.revision for e in seen] == [first]

        server.stop() if how == "stop" else server.kill()
        error = next_until_error(watch)
        watch.close()
        assert isinstance(error, StoreUnavailable)
        assert server.endpoint in str(error)
        with pytest.raises(StoreUnavailable):
            store.get("/o/a")

        server.restart()
        kept = poll(lambda: store.get("/o/a"))  # same ports, same data
        assert kept is not None and kept.mod_revision == first
        # Written by another client before this one watches again.
        missed = poll(lambda: writer.put("/o/b", b"2"))
        resumed = poll(lambda: store.watch("/o/", seen[-1].revision + 1))
        try:
            after = store.put("/o/c", b"3")
            events = collect(resumed, 2)
        finally:
            resumed.close()
        assert [(e.key, e.revision) for e in events] == [("/o/b", missed), ("/o/c", after)]
    finally:
        store.close()
        writer.close()


def test_a_store_opened_while_etcd_is_down_works_once_it_is_up(
    tmp_path: Path, connect: Connect
) -> None:
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        server.stop()
        store = connect(server.url)
        try:
            with pytest.raises(StoreUnavailable):
                store.put("/late/k", b"v")
            server.restart()
            revision = poll(lambda: store.put("/late/k", b"v"))
            got = store.get("/late/k")
            assert got is not None and got.mod_revision == revision
        finally:
            store.close()
    finally:
        server.stop()


# --- the test server itself ------------------------------------------------------------


def test_a_missing_etcd_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EtcdNotAvailable, match="not found"):
        EtcdServer(tmp_path, binary="etcd-that-is-not-installed").start()


def test_an_etcd_that_cannot_start_reports_its_log_tail(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path, extra_args=["--no-such-flag"])
    with pytest.raises(EtcdNotAvailable, match="no-such-flag") as caught:
        server.start(timeout=10)
    assert "log tail" in str(caught.value)
    assert server.pid is None


# --- ambiguous writes and the call budget ------------------------------------------


def test_a_write_etcd_never_answers_may_have_been_applied(
    etcd_server_private: EtcdServer, connect: Connect
) -> None:
    server = etcd_server_private
    store = connect(f"etcd://{server.endpoint}?timeout=1")
    try:
        store.put("/k", b"before")  # connected: the next request goes out on this channel
        assert server.pid is not None
        server.pause()  # returns once etcd is stopped: no answer can still slip out
        try:
            with pytest.raises(AmbiguousWrite, match="may have been applied; re-run to check") as w:
                store.put("/k", b"maybe")
            with pytest.raises(StoreUnavailable) as r:
                store.get("/k")  # a read that times out is plainly unavailable
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert w.value.exit_code == 4 and not isinstance(r.value, AmbiguousWrite)
        found = poll(lambda: store.get("/k"))
        assert found is not None and found.value in (b"before", b"maybe")  # re-running tells
    finally:
        store.close()


def test_a_write_that_never_reached_etcd_is_plainly_unavailable(connect: Connect) -> None:
    store = connect(f"etcd://127.0.0.1:{free_port()}?timeout=1")
    try:
        with pytest.raises(StoreUnavailable) as caught:
            store.put("/k", b"v")
    finally:
        store.close()
    assert not isinstance(caught.value, AmbiguousWrite)


@pytest.mark.parametrize("endpoints", [1, 2, 3, 7])
def test_the_endpoint_shares_of_a_call_add_up_to_its_budget(endpoints: int) -> None:
    budget, left = 5.0, 5.0
    shares = []
    for tried in range(endpoints):
        share = attempt_timeout(left, endpoints - tried)
        shares.append(share)
        left -= share  # the worst case: each endpoint uses all of its share
    assert sum(shares) == pytest.approx(budget)
    assert all(share > 0 for share in shares)
