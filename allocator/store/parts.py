"""A prefix read in parts, for a store that reads a prefix whole: the answer etcd's parts give.

etcd reads a large prefix as several key ranges at one past revision, so
that no single answer outlasts a call's budget
(:mod:`allocator.store.etcd.parts`). The other stores read a prefix in one
local call or one request, and keep no readable past: here the same
:class:`~allocator.store.base.Store` reads are answered from what is there
now, cut into the same parts. The keys are the same as etcd's where nothing
changed since ``revision``; each listing's revision is the one it was read
at (``revision`` or later).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from allocator.store.base import MAX_TXN_OPS, KeyValue, Listing, Read

if TYPE_CHECKING:
    from allocator.store.base import Store

__all__ = [
    "ListingReader",
    "cuts_of",
    "pages_of_whole",
    "parts_of_whole",
    "runs_read_each",
    "under_any",
]


class ListingReader(threading.Thread):
    """Reads every key under a prefix in one read; what it raised is raised by :meth:`result`."""

    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__(name="store-listing", daemon=True)
        self._store, self._prefix = store, prefix
        self._listing: Listing | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._listing = self._store.list(self._prefix)
        except BaseException as exc:  # raised again on the caller's thread
            self._error = exc

    def result(self) -> Listing:
        """The listing read, or what reading it raised (once the read has ended)."""
        self.join()
        if self._error is not None:
            raise self._error
        assert self._listing is not None
        return self._listing


def cuts_of(prefix: str, splits: Sequence[str]) -> list[str]:
    """The keys ``prefix``'s range is cut at: ``splits`` under it, sorted, each once."""
    return sorted({s for s in splits if s.startswith(prefix) and s != prefix})


def parts_of_whole(store: Store, prefix: str, splits: Sequence[str]) -> Iterator[Listing]:
    """Every key under ``prefix`` in one read, as ``len(cuts) + 1`` listings cut at ``splits``.

    The read starts now, on a thread of its own, as etcd's parts do: the
    caller works on while it runs. Part ``i`` holds the keys from the
    ``i``-th cut (the prefix for the first) up to the next; a key that is
    not text goes with the part its escaped name falls in. (UTF-8's byte
    order is its code points' order, so this is etcd's key order.)
    """
    reader = ListingReader(store, prefix)
    reader.start()
    return _cut(reader, cuts_of(prefix, splits))


def _cut(reader: ListingReader, cuts: list[str]) -> Iterator[Listing]:
    whole = reader.result()
    items: list[list[KeyValue]] = [[] for _ in range(len(cuts) + 1)]
    bad: list[list[str]] = [[] for _ in range(len(cuts) + 1)]
    for item in whole.items:
        items[bisect.bisect_right(cuts, item.key)].append(item)
    for key in whole.bad_keys:
        bad[bisect.bisect_right(cuts, key)].append(key)
    for part, bad_keys in zip(items, bad, strict=True):
        yield Listing(tuple(part), whole.revision, tuple(bad_keys))


def pages_of_whole(store: Store, prefix: str, page_keys: int) -> Iterator[Listing]:
    """Every key under ``prefix`` in one read, ``page_keys`` to a listing (bad keys in the last)."""
    whole = store.list(prefix)
    starts = range(0, len(whole.items), max(1, page_keys))
    pages = [whole.items[start : start + page_keys] for start in starts] or [()]
    for index, page in enumerate(pages):
        last = index == len(pages) - 1
        yield Listing(page, whole.revision, whole.bad_keys if last else ())


def runs_read_each(store: Store, runs: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
    """One listing per run: every key under each of its prefixes, read in batches of reads."""
    for run in runs:
        items: list[KeyValue] = []
        bad: list[str] = []
        last = revision
        for start in range(0, len(run), MAX_TXN_OPS):
            reads = [Read(prefix, prefix=True) for prefix in run[start : start + MAX_TXN_OPS]]
            for listing in store.read_many(reads):
                items.extend(listing.items)
                bad.extend(listing.bad_keys)
                last = listing.revision
        yield Listing(tuple(items), last, tuple(bad))


def under_any(listing: Listing, prefixes: Sequence[str]) -> Listing:
    """``listing`` less the keys under none of ``prefixes`` (sorted, none under another)."""

    def kept(key: str) -> bool:
        at = bisect.bisect_right(prefixes, key) - 1
        return at >= 0 and key.startswith(prefixes[at])

    items = tuple(item for item in listing.items if kept(item.key))
    return Listing(items, listing.revision, tuple(key for key in listing.bad_keys if kept(key)))
