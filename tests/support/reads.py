"""Reads under test: a store that counts what it returned, a reader that allows no bad record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from allocator.errors import BadRecord
from allocator.store import Listing, Read, Store

__all__ = ["CountingStore", "no_bad"]


def no_bad(error: BadRecord) -> None:
    """A history reader's ``on_bad`` for a test whose records are all good."""
    raise AssertionError(f"unexpected bad record: {error}")


class CountingStore:
    """A real store that counts the keys its reads returned, and names each prefix listed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys_read = 0
        self.prefixes: list[str] = []

    def list(self, prefix: str, **options: Any) -> Listing:
        listing = self.store.list(prefix, **options)
        self.keys_read += len(listing.items)
        self.prefixes.append(prefix)
        return listing

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        found = self.store.read_many(reads)
        self.keys_read += sum(len(listing.items) for listing in found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
