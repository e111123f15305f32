"""One prefix read as several key ranges at once, all at one revision (etcd's JSON gateway).

etcd's gateway turns a range answer into JSON on one core: for a fleet's
14,000 records that is most of what ``allocator status`` waits for. Split
into key ranges read over separate connections at the same time, etcd
marshals the parts on several cores while this process decodes the first
to arrive. Every part names the same ``revision``, so together they are
exactly the one snapshot a single range would have been.

The first part goes through the store's own connection (with its
failover, budget and error translation); the others each get a spare
connection. A spare part that fails for any reason is read again through
the store's connection, so a failure is reported exactly as a plain
``list`` reports it. A ``revision`` compacted meanwhile raises
:class:`~allocator.errors.Compacted`: the caller reads again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from allocator.store.base import KeyValue, Listing
from allocator.store.etcd_json import Json, b64, range_listing
from allocator.store.etcd_rules import prefix_range_end

if TYPE_CHECKING:
    from allocator.store.etcd_http import EtcdHttpStore

__all__ = ["key_ranges", "list_in_parts", "ranged_request"]


def key_ranges(prefix: str, splits: Sequence[str]) -> list[tuple[bytes, bytes]]:
    """The ``[start, end)`` key ranges that cover ``prefix``, cut at ``splits``.

    Splits outside the prefix, repeated or out of order are dropped: the
    ranges always cover every key under ``prefix`` exactly once.
    """
    start = prefix.encode("utf-8")
    end = prefix_range_end(start)
    cuts = sorted({s.encode("utf-8") for s in splits if s.startswith(prefix) and s != prefix})
    bounds = [start, *cuts, end]
    return list(itertools.pairwise(bounds))


def ranged_request(start: bytes, end: bytes, revision: int) -> Json:
    """A range request for the keys in ``[start, end)`` as at ``revision``, sorted by key."""
    return {
        "key": b64(start),
        "range_end": b64(end),
        "revision": str(revision),
        "sort_order": "ASCEND",
        "sort_target": "KEY",
    }


def list_in_parts(
    store: EtcdHttpStore, prefix: str, revision: int, splits: Sequence[str]
) -> Listing:
    """Every key under ``prefix`` as at ``revision``, read as one range per part at once."""
    requests = [ranged_request(lo, hi, revision) for lo, hi in key_ranges(prefix, splits)]
    spares = [_SparePart(store, request) for request in requests[1:]]
    for spare in spares:
        spare.start()
    try:
        items: list[KeyValue] = list(store.read_range(requests[0]).items)
        for spare in spares:
            spare.join()
            part = spare.listing if spare.listing is not None else store.read_range(spare.request)
            items.extend(part.items)
    finally:
        for spare in spares:
            spare.close()
    return Listing(tuple(items), revision)


class _SparePart(threading.Thread):
    """One part read over a spare connection; ``listing`` stays ``None`` if that failed."""

    def __init__(self, store: EtcdHttpStore, request: Json) -> None:
        super().__init__(name="etcd-range-part", daemon=True)
        self.request = request
        self.listing: Listing | None = None
        self._endpoint = store.spare_connection()
        self._timeout = store.config.timeout

    def run(self) -> None:
        until = time.monotonic() + self._timeout
        try:
            self._endpoint.ready(until)
            self.listing = self._endpoint.post_as(
                "/v3/kv/range", self.request, until, range_listing
            )
        except Exception:  # read again on the store's connection, which reports it
            self.listing = None

    def close(self) -> None:
        """Close the spare connection."""
        self._endpoint.close()
