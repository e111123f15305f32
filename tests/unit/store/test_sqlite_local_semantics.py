"""Semantics of the two local stores (SQLite and memory) that need a fake clock or
a small history: lease timing, reaping, compaction, and edge cases of writes.

Both backends run every test, through the ``local`` fixture.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocator.errors import CasConflict, Compacted, InvalidInput, LeaseLost, StoreUnavailable
from allocator.store import Compare, Delete, Put, Store, Watch
from allocator.store.memory import MemoryStore
from allocator.store.sqlite.store import SqliteStore
from tests.support.clock import FakeClock

HISTORY = 5


@dataclass
class Local:
    store: Store
    clock: FakeClock


@pytest.fixture(params=["memory", "sqlite"])
def local(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Local]:
    clock = FakeClock(1_000_000.0)
    store: Store
    if request.param == "memory":
        store = MemoryStore(clock=clock, history=HISTORY)
    else:
        store = SqliteStore(tmp_path / "store.db", clock=clock, history=HISTORY)
    try:
        yield Local(store, clock)
    finally:
        store.close()


# --- leases --------------------------------------------------------------------------


def test_a_lease_expires_exactly_after_its_ttl(local: Local) -> None:
    store, clock = local.store, local.clock
    lease = store.grant_lease(10)
    store.put("/k", b"v", lease=lease)

    clock.advance(9.9)
    assert store.get("/k") is not None
    clock.advance(0.2)
    assert store.get("/k") is None


def test_refresh_extends_from_the_time_of_refresh(local: Local) -> None:
    store, clock = local.store, local.clock
    lease = store.grant_lease(10)
    store.put("/k", b"v", lease=lease)

    clock.advance(8)
    store.refresh_lease(lease)
    clock.advance(8)
    assert store.get("/k") is not None
    clock.advance(2.5)
    assert store.get("/k") is None


def test_refreshing_an_expired_lease_raises_and_reaps_its_keys(local: Local) -> None:
    store, clock = local.store, local.clock
    lease = store.grant_lease(5)
    store.put("/k", b"v", lease=lease)
    clock.advance(6)

    with pytest.raises(LeaseLost):
        store.refresh_lease(lease)
    assert store.list("/").items == ()


def test_put_with_an_expired_lease_raises_and_writes_nothing(local: Local) -> None:
    store, clock = local.store, local.clock
    lease = store.grant_lease(5)
    clock.advance(6)

    with pytest.raises(LeaseLost):
        store.put("/k", b"v", lease=lease)
    assert store.get("/k") is None


def test_a_waiting_watch_reaps_expired_leases_itself(local: Local) -> None:
    store, clock = local.store, local.clock
    lease = store.grant_lease(5)
    written = store.put("/k", b"v", lease=lease)
    watch = store.watch("/", written + 1)
    clock.advance(6)

    events = watch.next(0)
    watch.close()

    assert [(e.type, e.key, e.revision) for e in events] == [("delete", "/k", written + 1)]


def test_each_expired_lease_is_one_revision_and_keyless_leases_take_none(local: Local) -> None:
    store, clock = local.store, local.clock
    first, second, empty = store.grant_lease(5), store.grant_lease(7), store.grant_lease(6)
    store.put("/a1", b"", lease=first)
    store.put("/a2", b"", lease=first)
    before = store.put("/b", b"", lease=second)
    clock.advance(10)

    assert store.list("/").items == ()
    after = store.put("/c", b"")  # the writer ends the expired leases first

    assert after == before + 3
    with pytest.raises(LeaseLost):
        store.refresh_lease(empty)


def test_a_plain_put_detaches_a_key_from_its_lease(local: Local) -> None:
    store = local.store
    lease = store.grant_lease(60)
    store.put("/k", b"leased", lease=lease)
    store.put("/k", b"plain")

    store.revoke_lease(lease)

    got = store.get("/k")
    assert got is not None
    assert (got.value, got.lease) == (b"plain", None)


def test_lease_ids_are_never_reused(local: Local) -> None:
    store = local.store
    ids = []
    for _ in range(5):
        ids.append(store.grant_lease(60))
        store.revoke_lease(ids[-1])
    assert len(set(ids)) == 5


# --- history and compaction --------------------------------------------------------


def test_a_watch_older_than_the_history_raises_compacted(local: Local) -> None:
    store = local.store
    revisions = [store.put(f"/k{i}", b"v") for i in range(12)]
    last = revisions[-1]

    old = store.watch("/", revisions[0])
    with pytest.raises(Compacted) as caught:
        old.next(0)
    old.close()

    assert caught.value.compact_revision == last - HISTORY
    kept = store.watch("/", last - HISTORY + 1)
    assert [e.revision for e in kept.next(0)] == revisions[-HISTORY:]
    kept.close()


def test_a_watch_that_falls_behind_the_history_raises_compacted(local: Local) -> None:
    store = local.store
    watch = store.watch("/", store.put("/start", b"v") + 1)
    for i in range(HISTORY + 1):
        store.put(f"/k{i}", b"v")

    with pytest.raises(Compacted):
        watch.next(0)
    watch.close()


def test_watch_from_revision_zero_starts_after_now(local: Local) -> None:
    store = local.store
    store.put("/before", b"v")
    watch = store.watch("/", 0)
    after = store.put("/after", b"v")

    assert [(e.key, e.revision) for e in watch.next(0)] == [("/after", after)]
    watch.close()


def test_closing_a_watch_wakes_a_blocked_next(local: Local) -> None:
    watch = local.store.watch("/", 1)
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(watch.next(60)))
    waiter.start()

    watch.close()
    waiter.join(timeout=30)

    assert not waiter.is_alive()
    assert results == [[]]


# --- writes ---------------------------------------------------------------------------


def test_both_stores_satisfy_the_protocols(local: Local) -> None:
    assert isinstance(local.store, Store)
    watch = local.store.watch("/", 1)
    assert isinstance(watch, Watch)
    watch.close()


def test_a_conflict_says_what_was_expected_and_found(local: Local) -> None:
    store = local.store
    current = store.put("/k", b"v")

    with pytest.raises(CasConflict) as caught:
        store.txn([Compare("/k", current), Compare("/k2", 0), Compare("/k", 0)], [])

    assert caught.value.keys == ("/k",)
    assert str(caught.value) == f"compare failed: /k expected absent, found at revision {current}"


def test_deleting_a_missing_key_changes_nothing(local: Local) -> None:
    store = local.store
    before = store.put("/k", b"v")
    watch = store.watch("/", before + 1)

    assert store.delete("/missing") is False
    assert store.txn([], [Delete("/missing")]) == before
    assert store.list("/").revision == before
    assert watch.next(0) == []
    watch.close()


def test_a_txn_writing_one_key_twice_is_refused(local: Local) -> None:
    store = local.store
    with pytest.raises(InvalidInput, match="/k"):
        store.txn([], [Put("/k", b"1"), Delete("/k")])
    assert store.get("/k") is None


@pytest.mark.parametrize("bad", ["no-slash", ""])
def test_prefixes_without_a_leading_slash_are_rejected(local: Local, bad: str) -> None:
    with pytest.raises(InvalidInput):
        local.store.list(bad)
    with pytest.raises(InvalidInput):
        local.store.watch(bad, 1)


def test_values_must_be_bytes(local: Local) -> None:
    with pytest.raises(InvalidInput, match="bytes"):
        local.store.put("/k", "text")  # type: ignore[arg-type]


def test_a_closed_store_reports_unavailable(local: Local) -> None:
    local.store.close()
    local.store.close()
    with pytest.raises(StoreUnavailable):
        local.store.get("/k")


# --- prefixes ---------------------------------------------------------------------------

# Characters around the edges of code point ordering, where a key range can go wrong.
_EDGE_CHARS = ["/", ".", "0", "a", "b", "\u00e9", "\ud7ff", "\ue000", "\uffff", "\U0010ffff"]
_KEY_PART = st.text(alphabet=st.sampled_from(_EDGE_CHARS), max_size=4)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(_KEY_PART, min_size=1, max_size=8, unique=True), wanted=_KEY_PART)
def test_list_and_watch_select_exactly_the_keys_with_the_prefix(
    local: Local, parts: list[str], wanted: str
) -> None:
    store = local.store
    base = f"/{uuid.uuid4().hex}"
    keys = {f"{base}/{part}" for part in parts}
    start = store.txn([], [Put(key, b"") for key in sorted(keys)])
    prefix = f"{base}/{wanted}"
    expected = sorted(k for k in keys if k.startswith(prefix))

    listed = [kv.key for kv in store.list(prefix).items]
    watch = store.watch(prefix, start)
    watched = sorted(e.key for e in watch.next(0))
    watch.close()

    assert listed == expected
    assert watched == expected
