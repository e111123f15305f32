"""Contract: reads, writes, revisions, prefixes and input checks, on every backend.

Servers are shared between tests, so revisions are compared with revisions
this test observed, never with absolute numbers.
"""

from __future__ import annotations

import pytest

from allocator.errors import InvalidInput, ValueTooLarge
from allocator.store import MAX_VALUE_BYTES, Compare, Put, Store


def test_get_of_a_missing_key_is_none(store: Store, prefix: str) -> None:
    assert store.get(f"{prefix}/missing") is None


def test_put_then_get_returns_value_and_revisions(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    revision = store.put(key, b"v1")

    got = store.get(key)

    assert got is not None
    assert (got.key, got.value) == (key, b"v1")
    assert got.mod_revision == revision
    assert got.create_revision == revision
    assert got.lease is None


def test_overwrite_keeps_create_revision_and_moves_mod_revision(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    created = store.put(key, b"v1")
    updated = store.put(key, b"v2")

    got = store.get(key)

    assert got is not None
    assert got.value == b"v2"
    assert got.create_revision == created
    assert got.mod_revision == updated > created


def test_every_write_advances_the_revision_by_exactly_one(store: Store, prefix: str) -> None:
    first = store.put(f"{prefix}/a", b"1")
    second = store.put(f"{prefix}/b", b"2")
    assert store.delete(f"{prefix}/a") is True
    after_delete = store.put(f"{prefix}/c", b"3")
    after_txn = store.txn([], [Put(f"{prefix}/d", b"4"), Put(f"{prefix}/e", b"5")])

    assert second == first + 1
    assert after_delete == second + 2  # the delete took second + 1
    assert after_txn == after_delete + 1
    assert store.list(f"{prefix}/").revision == after_txn


def test_recreated_key_gets_a_new_create_revision(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    store.put(key, b"old")
    store.delete(key)
    recreated = store.put(key, b"new")

    got = store.get(key)

    assert got is not None
    assert got.create_revision == recreated


def test_delete_reports_whether_the_key_existed(store: Store, prefix: str) -> None:
    key = f"{prefix}/k"
    store.put(key, b"v")

    assert store.delete(key) is True
    assert store.get(key) is None
    assert store.delete(key) is False


def test_list_returns_sorted_items_under_the_prefix_and_the_revision(
    store: Store, prefix: str
) -> None:
    for name in ("c", "a", "b/deep"):
        store.put(f"{prefix}/dir/{name}", name.encode())
    last = store.put(f"{prefix}/other", b"x")

    listing = store.list(f"{prefix}/dir/")

    assert [kv.key for kv in listing.items] == [
        f"{prefix}/dir/a",
        f"{prefix}/dir/b/deep",
        f"{prefix}/dir/c",
    ]
    assert [kv.value for kv in listing.items] == [b"a", b"b/deep", b"c"]
    assert listing.revision >= last


def test_list_of_an_empty_prefix_is_empty_with_a_revision(store: Store, prefix: str) -> None:
    seen = store.put(f"{prefix}/elsewhere", b"x")

    listing = store.list(f"{prefix}/nothing/")

    assert listing.items == ()
    assert listing.revision >= seen


def test_list_with_trailing_slash_excludes_sibling_prefixes(store: Store, prefix: str) -> None:
    store.put(f"{prefix}/a/b", b"the prefix key itself")
    store.put(f"{prefix}/a/b/x", b"inside")
    store.put(f"{prefix}/a/bc", b"sibling")
    store.put(f"{prefix}/a/bc/x", b"sibling child")

    listing = store.list(f"{prefix}/a/b/")

    assert [kv.key for kv in listing.items] == [f"{prefix}/a/b/x"]


def test_list_prefix_is_a_plain_string_prefix(store: Store, prefix: str) -> None:
    store.put(f"{prefix}/a/b", b"1")
    store.put(f"{prefix}/a/bc", b"2")
    store.put(f"{prefix}/a/c", b"3")

    listing = store.list(f"{prefix}/a/b")

    assert [kv.key for kv in listing.items] == [f"{prefix}/a/b", f"{prefix}/a/bc"]


def test_binary_and_empty_values_round_trip(store: Store, prefix: str) -> None:
    payload = bytes(range(256)) * 4
    store.put(f"{prefix}/bin", payload)
    store.put(f"{prefix}/empty", b"")

    got_bin = store.get(f"{prefix}/bin")
    got_empty = store.get(f"{prefix}/empty")

    assert got_bin is not None and got_bin.value == payload
    assert got_empty is not None and got_empty.value == b""


def test_a_value_of_exactly_the_limit_is_stored(store: Store, prefix: str) -> None:
    key = f"{prefix}/big"
    value = b"x" * MAX_VALUE_BYTES

    store.put(key, value)

    got = store.get(key)
    assert got is not None and got.value == value


def test_a_value_one_byte_over_the_limit_is_refused_and_nothing_written(
    store: Store, prefix: str
) -> None:
    key = f"{prefix}/big"

    with pytest.raises(ValueTooLarge) as caught:
        store.put(key, b"x" * (MAX_VALUE_BYTES + 1))

    message = str(caught.value)
    assert key in message
    assert str(MAX_VALUE_BYTES + 1) in message
    assert str(MAX_VALUE_BYTES) in message
    assert store.get(key) is None


def test_a_txn_with_one_oversized_value_writes_nothing(store: Store, prefix: str) -> None:
    before = store.put(f"{prefix}/seen", b"x")

    with pytest.raises(ValueTooLarge):
        store.txn(
            [],
            [Put(f"{prefix}/small", b"ok"), Put(f"{prefix}/big", b"x" * (MAX_VALUE_BYTES + 1))],
        )

    assert store.get(f"{prefix}/small") is None
    assert store.list(f"{prefix}/").revision == before


@pytest.mark.parametrize("bad_key", ["no-slash", "", "t/x"])
def test_keys_without_a_leading_slash_are_rejected(store: Store, bad_key: str) -> None:
    with pytest.raises(InvalidInput):
        store.put(bad_key, b"v")
    with pytest.raises(InvalidInput):
        store.get(bad_key)
    with pytest.raises(InvalidInput):
        store.delete(bad_key)
    with pytest.raises(InvalidInput):
        store.txn([Compare(bad_key, 0)], [])
    with pytest.raises(InvalidInput):
        store.txn([], [Put(bad_key, b"v")])


def test_a_rejected_key_writes_nothing(store: Store, prefix: str) -> None:
    before = store.put(f"{prefix}/seen", b"x")

    with pytest.raises(InvalidInput):
        store.txn([], [Put(f"{prefix}/good", b"v"), Put("bad", b"v")])

    assert store.get(f"{prefix}/good") is None
    assert store.list(f"{prefix}/").revision == before


def test_list_reads_the_first_or_the_last_few_keys_of_a_prefix(store: Store, prefix: str) -> None:
    keys = [f"{prefix}/h/{seq:012d}" for seq in range(7)]
    for key in keys:
        last = store.put(key, key.encode())
    store.put(f"{prefix}/i", b"after the prefix")

    newest = store.list(f"{prefix}/h/", limit=3, descending=True)
    assert [kv.key for kv in newest.items] == keys[:-4:-1]
    assert [kv.value for kv in newest.items] == [k.encode() for k in keys[:-4:-1]]
    assert newest.revision >= last
    assert [kv.key for kv in store.list(f"{prefix}/h/", limit=2).items] == keys[:2]
    assert [kv.key for kv in store.list(f"{prefix}/h/", descending=True).items] == keys[::-1]
    assert [kv.key for kv in store.list(f"{prefix}/h/", limit=100).items] == keys
    assert store.list(f"{prefix}/none/", limit=1, descending=True).items == ()


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3"])
def test_a_list_limit_below_one_or_not_a_whole_number_is_invalid_input(
    store: Store, prefix: str, limit: object
) -> None:
    with pytest.raises(InvalidInput):
        store.list(f"{prefix}/", limit=limit)  # type: ignore[arg-type]
