"""Contract: compare-and-swap, transactions and racing writers, on every backend."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from allocator.errors import CasConflict, ValueTooLarge
from allocator.store import MAX_TXN_OPS, Compare, Delete, Put, Store


def test_create_only_succeeds_when_the_key_is_absent(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"

    created = store.put(key, b"first", expect_revision=0)

    with pytest.raises(CasConflict) as caught:
        store.put(key, b"second", expect_revision=0)
    assert caught.value.keys == (key,)
    got = store.get(key)
    assert got is not None
    assert (got.value, got.mod_revision) == (b"first", created)


def test_put_with_the_current_revision_succeeds(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    created = store.put(key, b"v1")

    updated = store.put(key, b"v2", expect_revision=created)

    got = store.get(key)
    assert got is not None
    assert got.value == b"v2"
    assert got.mod_revision == updated == created + 1
    assert got.create_revision == created


def test_put_with_a_stale_revision_fails_and_writes_nothing(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    stale = store.put(key, b"v1")
    current = store.put(key, b"v2")

    with pytest.raises(CasConflict) as caught:
        store.put(key, b"v3", expect_revision=stale)

    assert caught.value.keys == (key,)
    got = store.get(key)
    assert got is not None
    assert (got.value, got.mod_revision) == (b"v2", current)
    assert store.list(f"{prefix}/").revision == current


def test_put_expecting_a_revision_on_a_missing_key_fails(store: Store, prefix: str) -> None:
    seen = store.put(f"{prefix}/other", b"x")

    with pytest.raises(CasConflict):
        store.put(f"{prefix}/missing", b"v", expect_revision=seen)

    assert store.get(f"{prefix}/missing") is None


def test_delete_with_a_stale_revision_keeps_the_key(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    stale = store.put(key, b"v1")
    store.put(key, b"v2")

    with pytest.raises(CasConflict) as caught:
        store.delete(key, expect_revision=stale)

    assert caught.value.keys == (key,)
    got = store.get(key)
    assert got is not None and got.value == b"v2"


def test_delete_with_the_current_revision_deletes(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    current = store.put(key, b"v")

    assert store.delete(key, expect_revision=current) is True
    assert store.get(key) is None


def test_txn_applies_puts_and_deletes_at_one_revision(store: Store, prefix: str) -> None:
    old = f"{prefix}/old"
    guard = f"{prefix}/guard"
    store.put(old, b"gone soon")
    guard_revision = store.put(guard, b"g")

    revision = store.txn(
        [Compare(guard, guard_revision), Compare(f"{prefix}/new", 0)],
        [Put(f"{prefix}/new", b"n"), Put(f"{prefix}/other", b"o"), Delete(old)],
    )

    assert revision == guard_revision + 1
    assert store.get(old) is None
    new, other = store.get(f"{prefix}/new"), store.get(f"{prefix}/other")
    assert new is not None and other is not None
    assert new.mod_revision == other.mod_revision == revision
    assert store.list(f"{prefix}/").revision == revision


def test_txn_with_one_failing_compare_writes_nothing(store: Store, prefix: str) -> None:
    good, bad = f"{prefix}/good", f"{prefix}/bad"
    good_revision = store.put(good, b"g")
    stale = store.put(bad, b"b1")
    before = store.put(bad, b"b2")

    with pytest.raises(CasConflict) as caught:
        store.txn(
            [Compare(good, good_revision), Compare(bad, stale)],
            [Put(good, b"changed"), Put(f"{prefix}/new", b"n"), Delete(bad)],
        )

    assert caught.value.keys == (bad,)
    assert store.list(f"{prefix}/").revision == before
    got_good, got_bad = store.get(good), store.get(bad)
    assert got_good is not None and got_good.value == b"g"
    assert got_bad is not None and got_bad.value == b"b2"
    assert store.get(f"{prefix}/new") is None


def test_txn_create_only_compare_fails_when_the_key_exists(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    before = store.put(key, b"v")

    with pytest.raises(CasConflict) as caught:
        store.txn([Compare(key, 0)], [Put(key, b"other")])

    assert caught.value.keys == (key,)
    assert store.list(f"{prefix}/").revision == before


def test_txn_without_compares_always_applies(store: Store, prefix: str) -> None:
    revision = store.txn([], [Put(f"{prefix}/a", b"1")])

    got = store.get(f"{prefix}/a")
    assert got is not None and got.mod_revision == revision


def test_concurrent_create_only_writers_have_exactly_one_winner(
    opener: Callable[[], Store], prefix: str
) -> None:
    writers = 16
    key = f"{prefix}/contested"
    stores = [opener() for _ in range(writers)]
    start = threading.Barrier(writers, timeout=60)

    def race(index: int) -> str:
        start.wait()
        try:
            stores[index].put(key, str(index).encode(), expect_revision=0)
        except CasConflict:
            return "lost"
        return "won"

    try:
        with ThreadPoolExecutor(max_workers=writers) as pool:
            outcomes = list(pool.map(race, range(writers)))
    finally:
        for s in stores:
            s.close()

    assert outcomes.count("won") == 1
    assert outcomes.count("lost") == writers - 1
    check = opener()
    try:
        got = check.get(key)
    finally:
        check.close()
    assert got is not None
    assert got.value == str(outcomes.index("won")).encode()


def test_every_store_takes_a_txn_of_max_txn_ops_and_states_its_own_limit(
    store: Store, prefix: str
) -> None:
    keys = [f"{prefix}/n{i}" for i in range(MAX_TXN_OPS // 2)]
    compares = [Compare(key, 0) for key in keys]

    store.txn(compares, [Put(key, b"v") for key in keys])

    assert all(store.get(key) is not None for key in keys)
    limit = store.max_txn_ops
    assert limit is None or limit >= MAX_TXN_OPS


def test_a_txn_over_the_stores_limit_is_refused_and_writes_nothing(
    store: Store, prefix: str
) -> None:
    if store.max_txn_ops is None:  # no limit (SQLite): a large one goes through
        big = [Put(f"{prefix}/n{i}", b"v") for i in range(4 * MAX_TXN_OPS)]
        store.txn([], big)
        assert len(store.list(f"{prefix}/").items) == len(big)
        return
    keys = [f"{prefix}/n{i}" for i in range(store.max_txn_ops + 1)]

    with pytest.raises(ValueTooLarge, match="at most"):
        store.txn([], [Put(key, b"v") for key in keys])

    assert store.list(f"{prefix}/").items == ()
