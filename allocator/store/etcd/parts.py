"""One prefix read as several key ranges, all at one revision (etcd's JSON gateway).

etcd's gateway turns a range answer into JSON on one core: for a fleet's
14,000 records that took longer than anything else status does. Split
into key ranges read over separate connections, a few at a time, etcd
marshals the next parts on other cores while this process decodes the
one before. Every part names the same ``revision``, so together they are
exactly the one snapshot a single range would have been.

The parts come back in key order, each as soon as it and those before it
are in. The first part goes through the store's own connection (with its
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
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from allocator.store.base import Listing
from allocator.store.etcd.config import EtcdConfig
from allocator.store.etcd.connection import Endpoint
from allocator.store.etcd.json_api import Json, b64, range_listing
from allocator.store.etcd.rules import prefix_range_end

__all__ = [
    "AT_ONCE",
    "RangeSource",
    "key_ranges",
    "list_in_pages",
    "list_in_parts",
    "list_in_ranges",
    "ranged_request",
]


class RangeSource(Protocol):
    """What the parts are read through: the etcd store's range calls and its connections."""

    @property
    def config(self) -> EtcdConfig:
        """The store's settings (its call budget)."""
        ...

    def read_range(self, request: Json) -> Listing:
        """One range request's keys, with failover and the call's budget."""
        ...

    def spare_connection(self) -> Endpoint:
        """A second connection to the endpoint in use (not yet open)."""
        ...


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


def list_in_pages(
    store: RangeSource, prefix: str, revision: int, page_keys: int
) -> Iterator[Listing]:
    """Every key under ``prefix`` as at ``revision``: one range request per ``page_keys`` keys."""
    start, end = prefix.encode(), prefix_range_end(prefix.encode())
    while True:
        request = {**ranged_request(start, end, revision), "limit": str(page_keys)}
        page = store.read_range(request)
        yield page
        if not page.items or len(page.items) + len(page.bad_keys) < page_keys:
            return
        start = _after(page)


def _after(page: Listing) -> bytes:
    """The first key after ``page``'s last text key (keys come sorted).

    Keys that are not text after it are read again with the next page (and
    reported twice): they are named escaped, not as their bytes.
    """
    return page.items[-1].key.encode() + b"\0"


#: Parts read at a time: enough to keep etcd busy on another core while this
#: process decodes the part before, few enough that the first part comes
#: back soon (etcd shares its cores among every range it is marshalling).
AT_ONCE = 3


def list_in_parts(
    store: RangeSource,
    prefix: str,
    revision: int,
    splits: Sequence[str],
    at_once: int = AT_ONCE,
) -> Iterator[Listing]:
    """Every key under ``prefix`` as at ``revision``: one listing per part, in key order.

    ``at_once`` parts are read from now on, and one more each time one of
    them is in; iterating waits for each in turn, so a caller works on the
    first part while etcd marshals the next. An error is raised where its
    part would have been.
    """
    return list_in_ranges(store, key_ranges(prefix, splits), revision, at_once)


def list_in_ranges(
    store: RangeSource,
    ranges: Sequence[tuple[bytes, bytes]],
    revision: int,
    at_once: int = AT_ONCE,
) -> Iterator[Listing]:
    """The keys in each ``[start, end)`` of ``ranges`` as at ``revision`` (as list_in_parts)."""
    requests = [ranged_request(lo, hi, revision) for lo, hi in ranges]
    starter = _Starter()
    parts = [
        _Part(store, request, spare=index > 0, done=starter.start_next)
        for index, request in enumerate(requests)
    ]
    starter.parts = iter(parts)
    for _ in range(max(1, at_once)):
        starter.start_next()
    return _in_order(store, parts, revision)


def _in_order(store: RangeSource, parts: list[_Part], revision: int) -> Iterator[Listing]:
    try:
        for part in parts:
            part.join()  # started: every part before it has ended
            # etcd's header names its newest revision; these keys are as at ``revision``
            found = part.listing(store)
            yield Listing(found.items, revision, found.bad_keys)
    finally:
        for part in parts:
            part.close()


class _Starter:
    """Starts the parts in key order, one each time it is called."""

    def __init__(self) -> None:
        self.parts: Iterator[_Part] = iter(())
        self._lock = threading.Lock()

    def start_next(self) -> None:
        """Start the next part not abandoned, if any."""
        with self._lock:
            for part in self.parts:
                if not part.abandoned:
                    part.start()
                    return


class _Part(threading.Thread):
    """One part's read: the first on the store's own connection, the others on spare ones."""

    def __init__(
        self, store: RangeSource, request: Json, *, spare: bool, done: Callable[[], None]
    ) -> None:
        super().__init__(name="etcd-range-part", daemon=True)
        self._done = done
        self.request = request
        self._store = store if not spare else None
        self._endpoint = store.spare_connection() if spare else None
        self._timeout = store.config.timeout
        self._listing: Listing | None = None
        self._error: Exception | None = None
        self.abandoned = False

    def run(self) -> None:
        try:
            if self._endpoint is None:
                assert self._store is not None
                self._listing = self._store.read_range(self.request)
                return
            until = time.monotonic() + self._timeout
            self._endpoint.ready(until)
            self._listing = self._endpoint.post_as(
                "/v3/kv/range", self.request, until, range_listing
            )
        except Exception as exc:  # raised, or read again, on the caller's thread
            self._error = exc
        finally:
            self._done()
            if self.abandoned:  # closed while connecting: this connection is new
                self.close()

    def listing(self, store: RangeSource) -> Listing:
        """What the part read (after :meth:`join`).

        A spare connection's failure is read again on the store's own,
        which fails over and reports as every other call.
        """
        if self._listing is not None:
            return self._listing
        if self._endpoint is None and self._error is not None:
            raise self._error
        return store.read_range(self.request)

    def close(self) -> None:
        """Close the spare connection, if any (now, and again once the read ends)."""
        self.abandoned = True
        if self._endpoint is not None:
            self._endpoint.close()
