"""Contract: batched reads, and transactions whose lost compare returns fresh state."""

from __future__ import annotations

import time

import pytest

from allocator.errors import InvalidInput
from allocator.store import Compare, Delete, Event, Put, Read, Store


def test_read_many_returns_each_read_in_order(store: Store, prefix: str) -> None:
    store.put(f"{prefix}/a/1", b"one")
    store.put(f"{prefix}/a/2", b"two")
    store.put(f"{prefix}/a1", b"sibling")  # shares the text, not the prefix "a/"
    last = store.put(f"{prefix}/k", b"key")

    found = store.read_many(
        [Read(f"{prefix}/k"), Read(f"{prefix}/a/", prefix=True), Read(f"{prefix}/missing")]
    )

    assert [[(kv.key, kv.value) for kv in listing.items] for listing in found] == [
        [(f"{prefix}/k", b"key")],
        [(f"{prefix}/a/1", b"one"), (f"{prefix}/a/2", b"two")],
        [],
    ]
    assert found[0].items[0].mod_revision == last


def test_read_many_without_values_keeps_the_revisions(store: Store, prefix: str) -> None:
    written = store.put(f"{prefix}/big", b"x" * 1000)

    (listing,) = store.read_many([Read(f"{prefix}/big", values=False)])

    assert [(kv.key, kv.value, kv.mod_revision) for kv in listing.items] == [
        (f"{prefix}/big", b"", written)
    ]


def test_txn_or_read_applies_the_writes_when_every_compare_holds(store: Store, prefix: str) -> None:
    seen = store.put(f"{prefix}/guard", b"g")

    outcome = store.txn_or_read(
        [Compare(f"{prefix}/guard", seen)], [Put(f"{prefix}/w", b"v")], [Read(f"{prefix}/guard")]
    )

    assert outcome.succeeded and outcome.reads == () and outcome.changed == ()
    written = store.get(f"{prefix}/w")
    assert written is not None and written.mod_revision == outcome.revision


def test_txn_or_read_returns_fresh_state_when_a_compare_fails(store: Store, prefix: str) -> None:
    stale = store.put(f"{prefix}/guard", b"old")
    fresh = store.put(f"{prefix}/guard", b"new")
    store.put(f"{prefix}/dir/x", b"x")

    outcome = store.txn_or_read(
        [Compare(f"{prefix}/guard", stale)],
        [Put(f"{prefix}/w", b"v")],
        [Read(f"{prefix}/guard"), Read(f"{prefix}/dir/", prefix=True)],
    )

    assert not outcome.succeeded
    assert outcome.changed == (f"{prefix}/guard",)
    guard, listing = outcome.reads
    assert [(kv.value, kv.mod_revision) for kv in guard.items] == [(b"new", fresh)]
    assert [kv.key for kv in listing.items] == [f"{prefix}/dir/x"]
    assert store.get(f"{prefix}/w") is None


def test_read_many_reads_the_newest_few_of_each_prefix(store: Store, prefix: str) -> None:
    for stream in ("a", "b"):
        for seq in range(5):
            store.put(f"{prefix}/{stream}/{seq:03d}", f"{stream}{seq}".encode())

    found = store.read_many(
        [
            Read(f"{prefix}/a/", prefix=True, limit=2, descending=True),
            Read(f"{prefix}/b/", prefix=True, limit=1),
            Read(f"{prefix}/c/", prefix=True, limit=3, descending=True),
        ]
    )

    assert [[kv.value for kv in listing.items] for listing in found] == [
        [b"a4", b"a3"],
        [b"b0"],
        [],
    ]


def test_read_many_newest_gives_the_keys_written_last_first(store: Store, prefix: str) -> None:
    for name in ("c", "a", "d", "b"):
        store.put(f"{prefix}/n/{name}", b"v")
    store.put(f"{prefix}/n/a", b"again")  # now the newest
    store.put(f"{prefix}/other", b"x")  # not under the prefix

    newest, all_of_them = store.read_many(
        [
            Read(f"{prefix}/n/", prefix=True, values=False, limit=2, newest=True),
            Read(f"{prefix}/n/", prefix=True, newest=True),
        ]
    )

    assert [kv.key[len(prefix) :] for kv in newest.items] == ["/n/a", "/n/b"]
    assert [kv.value for kv in newest.items] == [b"", b""]
    assert [kv.key[len(prefix) :] for kv in all_of_them.items] == ["/n/a", "/n/b", "/n/d", "/n/c"]


def test_a_prefix_delete_drops_every_key_under_it_in_one_operation(
    store: Store, prefix: str
) -> None:
    for key in ("old/1", "old/2", "old/3/x", "older", "new/1"):
        store.put(f"{prefix}/{key}", b"v")
    watch = store.watch(f"{prefix}/", store.list(f"{prefix}/").revision + 1)
    try:
        revision = store.txn(
            [], [Put(f"{prefix}/new/2", b"v"), Delete(f"{prefix}/old/", prefix=True)]
        )
        deadline = time.monotonic() + 10
        events: list[Event] = []
        while len(events) < 4 and time.monotonic() < deadline:
            events += watch.next(0.5)
    finally:
        watch.close()

    listing = store.list(f"{prefix}/")
    assert [kv.key[len(prefix) + 1 :] for kv in listing.items] == ["new/1", "new/2", "older"]
    assert sorted((e.type, e.key[len(prefix) + 1 :]) for e in events) == [
        ("delete", "old/1"),
        ("delete", "old/2"),
        ("delete", "old/3/x"),
        ("put", "new/2"),
    ]
    assert {e.revision for e in events} == {revision}


def test_a_txn_writing_under_a_prefix_it_deletes_is_refused(store: Store, prefix: str) -> None:
    with pytest.raises(InvalidInput):
        store.txn([], [Put(f"{prefix}/d/1", b"v"), Delete(f"{prefix}/d/", prefix=True)])

    assert store.get(f"{prefix}/d/1") is None
