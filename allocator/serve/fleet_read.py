"""What ``allocator serve`` reads when it (re)starts its watch: only what it mirrors.

The policy and the wait queue in one batch, then the hosts' keys at that
batch's revision, on etcd in pages of :data:`PAGE_KEYS` keys (one range
request each, each well within the store's call deadline). The job index,
history and the rest of the prefix are never read: on a busy machine a
12,500-host fleet's whole prefix in one range outlasted that deadline, and
``serve`` never came up.

Where the hosts cannot be read at the batch's revision (another store
reads them as they are now; on etcd that revision may be compacted
already) they are read as they are now, at a later revision; the watch
starts after the batch's revision either way, so the changes in between
are applied again (to the same final state).
"""

from __future__ import annotations

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
    try:
        return list(store.list_pages(prefix, revision, PAGE_KEYS))
    except Compacted:
        return [store.list(prefix)]
