"""What ``allocator serve`` reads when it (re)starts its watch: only what it mirrors.

The policy and the wait queue in one batch, then the hosts' keys at that
batch's revision, on etcd in pages of :data:`PAGE_KEYS` keys (one range
request each, each well within the store's call deadline). The job index,
history and the rest of the prefix are never read: on a busy machine a
12,500-host fleet's whole prefix in one range outlasted that deadline, and
``serve`` never came up.

Where the hosts cannot be read at the batch's revision (another store, or
that revision compacted already) they are read as they are now, at a
later revision; the watch starts after the batch's revision either way, so
the changes in between are applied again (to the same final state).
"""

from __future__ import annotations

from collections.abc import Iterator

from allocator.errors import Compacted
from allocator.records.keys import KeyLayout
from allocator.store import KeyValue, Listing, Read, Store

__all__ = ["PAGE_KEYS", "read_fleet"]

#: Keys per range request of the hosts' keys (some 350 hosts' worth, a few megabytes).
PAGE_KEYS = 5000


def read_fleet(store: Store, layout: KeyLayout) -> Listing:
    """The policy, the queue, the agents' counts and every host's keys, and the revision read at."""
    policy, queue, counts = store.read_many(
        [Read(layout.policy), Read(layout.queue, prefix=True), Read(layout.counts, prefix=True)]
    )
    revision = policy.revision
    items: list[KeyValue] = [*policy.items, *queue.items, *counts.items]
    bad = [*policy.bad_keys, *queue.bad_keys, *counts.bad_keys]
    for part in _hosts(store, layout.hosts, revision):
        items += part.items
        bad += part.bad_keys
    return Listing(tuple(items), revision, tuple(bad))


def _hosts(store: Store, prefix: str, revision: int) -> list[Listing]:
    if getattr(store, "read_range", None) is not None:
        try:
            return list(_pages(store, prefix, revision))
        except Compacted:
            pass
    return [store.list(prefix)]


def _pages(store: Store, prefix: str, revision: int) -> Iterator[Listing]:
    """Every key under ``prefix`` as at ``revision``, :data:`PAGE_KEYS` at a time (etcd)."""
    from allocator.store.etcd.parts import ranged_request
    from allocator.store.etcd.rules import prefix_range_end

    start, end = prefix.encode(), prefix_range_end(prefix.encode())
    while True:
        request = {**ranged_request(start, end, revision), "limit": str(PAGE_KEYS)}
        page: Listing = store.read_range(request)  # type: ignore[attr-defined]
        yield page
        if not page.items or len(page.items) + len(page.bad_keys) < PAGE_KEYS:
            return
        start = _after(page)


def _after(page: Listing) -> bytes:
    """The first key after ``page``'s last text key (keys come sorted).

    Keys that are not text after it are read again with the next page (and
    reported twice): they are named escaped, not as their bytes.
    """
    return page.items[-1].key.encode() + b"\0"
