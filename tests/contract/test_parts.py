"""Contract: a prefix read in parts, in runs of prefixes or in pages: the same keys everywhere."""

from __future__ import annotations

import pytest

from allocator.store import Listing, Put, Store


def _fill(store: Store, prefix: str) -> tuple[list[str], int]:
    """Keys under ``{prefix}/h/``, one sibling beside it; the keys and the revision written at."""
    keys = [f"{prefix}/h/{name}/{leaf}" for name in ("a", "b", "bb", "c", "d") for leaf in "xy"]
    revision = store.txn([], [Put(key, key.encode()) for key in keys])
    store.put(f"{prefix}/h-sibling", b"not under h/")
    return keys, revision


def _keys(listings: list[Listing]) -> list[list[str]]:
    return [[kv.key for kv in listing.items] for listing in listings]


def test_list_parts_cuts_the_prefix_at_the_splits_in_key_order(store: Store, prefix: str) -> None:
    keys, revision = _fill(store, prefix)
    hosts = f"{prefix}/h/"
    # Out of order, repeated, outside the prefix and the prefix itself: dropped.
    splits = [f"{hosts}c/", f"{hosts}b/", f"{hosts}c/", f"{prefix}/z/", hosts]

    parts = list(store.list_parts(hosts, revision, splits))

    assert _keys(parts) == [keys[:2], keys[2:6], keys[6:]]
    assert all(part.revision >= revision for part in parts)
    assert [kv.value for part in parts for kv in part.items] == [key.encode() for key in keys]


def test_list_parts_without_splits_is_one_part(store: Store, prefix: str) -> None:
    keys, revision = _fill(store, prefix)

    assert _keys(list(store.list_parts(f"{prefix}/h/", revision))) == [keys]


def test_list_runs_reads_only_the_runs_prefixes(store: Store, prefix: str) -> None:
    keys, revision = _fill(store, prefix)
    host = f"{prefix}/h/".__add__
    # ``b/`` and ``c/`` are one run: ``bb/`` lies between them in key order, and is left out.
    runs = [[host("a/")], [host("b/"), host("c/")], [host("missing/")]]

    found = list(store.list_runs(runs, revision))

    assert _keys(found) == [keys[:2], [*keys[2:4], *keys[6:8]], []]
    assert all(listing.revision >= revision for listing in found)


@pytest.mark.parametrize("page_keys", [1, 3, 10, 100])
def test_list_pages_holds_every_key_once_in_order_a_page_at_most_page_keys(
    store: Store, prefix: str, page_keys: int
) -> None:
    keys, revision = _fill(store, prefix)

    pages = list(store.list_pages(f"{prefix}/h/", revision, page_keys))

    assert [key for page in _keys(pages) for key in page] == keys
    assert all(len(page.items) <= page_keys for page in pages)


def test_list_pages_of_an_empty_prefix_is_empty(store: Store, prefix: str) -> None:
    revision = store.put(f"{prefix}/elsewhere", b"x")

    pages = list(store.list_pages(f"{prefix}/none/", revision, 5))

    assert [kv for page in pages for kv in page.items] == []
