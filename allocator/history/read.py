"""Reading history newest first, at the cost of what is shown.

Entry keys sort by sequence number, so a stream's newest entries are the
first keys of a descending range read with a limit (every backend's
``list(prefix, limit=, descending=True)``). A stream is read in pages,
each twice the size of the one before, so a reader that needs ``n`` entries
reads fewer than ``2n`` (plus its first page) however long the stream is;
a ``--since`` window ends a stream's reading at its first older entry.

A fleet-wide read with a limit (and no ``job`` or ``gpu``) asks the
fleet's index of recent entries first (:func:`read_recent`,
:mod:`allocator.history.index`): three requests, about twice the
limit in keys, whatever the fleet's size. When the index cannot answer
alone it falls back to what follows.

The fleet's history is every host's stream and the policy's, merged newest
first (by the revision that wrote each entry, as :func:`read_history`
sorts). Every append rewrites its stream's head in the same transaction,
so no entry of a stream is newer than its head: the heads, read keys-only
(a revision each, one request), rank the streams, and a stream is opened
only once its head's revision could beat the next entry to show. With a
limit, ``history --limit 20`` on 12,500 hosts opens the few streams the 20
newest entries are in (in batches, one request each, of 8, then 16, ...),
not one read a host; the merge pulls from an opened stream only when its
newest unread entry is next, so streams are read only as far as their
entries are shown. (etcd still walks every head to rank them: tens of
milliseconds at 12,500 hosts, which the index avoids.)
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator
from datetime import datetime

from allocator.errors import BadRecord, InvalidName
from allocator.history import index as history_index
from allocator.history.stream import (
    OnBad,
    Stored,
    Stream,
    decode_entry,
    host_stream,
    policy_stream,
    select,
)
from allocator.records.keys import KeyLayout, validate_name
from allocator.store import MAX_TXN_OPS, KeyValue, Listing, Read, Store
from allocator.util.times import parse_time, utc_now

__all__ = [
    "MAX_PAGE",
    "SINCE_PAGE",
    "first_page",
    "head_hosts",
    "newest_entries",
    "query_history",
    "read_recent",
]

#: The largest page read at once: a stream's 1,000 entries are ~480 KB.
MAX_PAGE = 1024
#: The first page of a ``--since`` read without a limit: the window decides how far.
SINCE_PAGE = 8
#: Streams opened by a fleet-wide read's first request (each further request doubles it).
FIRST_OPENED = 8
#: Heads a fleet-wide read with a limit ranks first (twice the limit, if more).
FIRST_HEADS = 16
#: Past this many heads, a ranking reads them all (keys only).
MAX_HEADS = 4096
#: Buckets of the index (100 s each) the first request reads; each further one twice as many.
FIRST_BUCKETS = 4


def first_page(limit: int | None, streams: int, *, windowed: bool = False) -> int | None:
    """How many entries to read of each stream first (``None``: all of it, in one read).

    A stream alone gets the limit; ``streams`` share twice the limit, so a
    fleet's first reads are one entry a host, and only the hosts whose
    entries are shown are read further. Without a limit a stream is read
    whole, unless ``windowed`` (a ``--since``): then from a small page.
    """
    if limit is None:
        return SINCE_PAGE if windowed else None
    return max(1, min(limit, MAX_PAGE, math.ceil(2 * limit / max(streams, 1))))


def newest_entries(
    store: Store,
    stream: Stream,
    on_bad: OnBad,
    *,
    page: int | None,
    since: datetime | None = None,
    first: Listing | None = None,
) -> Iterator[Stored]:
    """``stream``'s entries newest first, read ``page`` at a time (each page twice the last).

    Pages are re-read from the newest end, so an entry appended meanwhile
    is skipped (it is newer than what was shown) rather than shown twice.
    With ``since``, reading ends at the first entry written before it.
    ``first``: the first page, already read.
    """
    size = page
    last_key: str | None = None
    while True:
        if first is not None:
            listing, first = first, None
        else:
            listing = store.list(stream.prefix, limit=size, descending=True)
        for item in listing.items:
            if last_key is not None and item.key >= last_key:
                continue  # shown already, or appended after the reading began
            last_key = item.key
            try:
                stored = Stored(decode_entry(item, stream), item.mod_revision)
            except BadRecord as exc:
                on_bad(exc)
                continue
            if since is not None and _before(stored, since):
                return
            yield stored
        if size is None or len(listing.items) < size:
            return
        size = min(size * 2, MAX_PAGE) if size < MAX_PAGE else size + MAX_PAGE


def read_recent(
    store: Store,
    layout: KeyLayout,
    on_bad: OnBad,
    *,
    limit: int,
    now: datetime,
    since: datetime | None = None,
) -> list[Stored] | None:
    """The fleet's newest ``limit`` entries by its index, newest first; ``None``: ask the heads.

    The first ``limit`` pointers, read a few 100-second buckets at a time
    back from ``now`` (etcd walks a whole range to count it, so no read
    spans the index), every pointer of the last second they reach (ranked
    by revision: a second's pointers are in key order, not write order),
    then exactly the ``limit`` entries chosen: three requests on a busy
    fleet, whatever its size. ``None`` when the index cannot answer alone:
    fewer pointers than asked for in the hours it keeps (a quiet fleet,
    entries written before the index), or an entry gone or damaged
    (dropped since its pointer was written).
    """
    history = layout.history
    pointers = _first_pointers(store, history, limit, int(now.timestamp()))
    if len(pointers) < limit:
        return None
    chosen = _by_time_then_revision(store, history, pointers)
    keys = [key for kv in chosen for key in history_index.entry_keys(history, kv)][:limit]
    found: list[Stored] = []
    for start in range(0, len(keys), MAX_TXN_OPS):
        batch = keys[start : start + MAX_TXN_OPS]
        for key, listing in zip(batch, store.read_many([Read(k) for k in batch]), strict=True):
            stored = _indexed_entry(layout, key, listing, on_bad)
            if stored is None:
                return None
            found.append(stored)
    if len(found) < limit:
        return None
    found.sort(key=_newest, reverse=True)
    # Pointers run newest first: once one entry is before ``since``, so are the rest.
    return [s for s in found if since is None or not _before(s, since)]


def _first_pointers(store: Store, history: str, limit: int, now: int) -> list[KeyValue]:
    """The index's first ``limit`` pointers (fewer: all it holds near ``now``)."""
    buckets = history_index.bucket_prefixes(history, now)
    found: list[KeyValue] = []
    start, size = 0, FIRST_BUCKETS
    while len(found) < limit and start < len(buckets):
        need = limit - len(found)
        reads = [Read(b, prefix=True, limit=need) for b in buckets[start : start + size]]
        for listing in store.read_many(reads):
            found += listing.items
        start, size = start + size, min(2 * size, MAX_TXN_OPS)
    return found[:limit]


def _by_time_then_revision(store: Store, history: str, pointers: list[KeyValue]) -> list[KeyValue]:
    """``pointers`` (the index's first) with every pointer of the last one's second, newest
    second first and, within one, the revision that wrote them newest first."""
    last = history_index.second_prefix(history, pointers[-1].key)
    if last is not None:
        (tied,) = store.read_many([Read(last, prefix=True)])
        pointers = [kv for kv in pointers if not kv.key.startswith(last)] + list(tied.items)

    def order(kv: KeyValue) -> tuple[str, int]:
        return history_index.second_prefix(history, kv.key) or kv.key, -kv.mod_revision

    return sorted(pointers, key=order)


def _indexed_entry(layout: KeyLayout, key: str, listing: Listing, on_bad: OnBad) -> Stored | None:
    """The entry a pointer names, as read; ``None``: gone, damaged or not an entry key."""
    path = key[len(layout.history) :]
    kind, _, rest = path.partition("/")
    host, _, _ = rest.rpartition("/")
    try:
        if kind == "hosts" and host:
            stream = host_stream(layout, host)
        elif kind == "policy" and "/" not in rest:
            stream = policy_stream(layout)
        else:
            return None
        if not listing.items or not key.startswith(stream.prefix):
            return None
        return Stored(decode_entry(listing.items[0], stream), listing.items[0].mod_revision)
    except InvalidName:
        return None
    except BadRecord as exc:
        on_bad(exc)
        return None


def query_history(
    store: Store,
    layout: KeyLayout,
    on_bad: OnBad,
    *,
    host: str | None = None,
    job: str | None = None,
    gpu: int | None = None,
    since: datetime | None = None,
    limit: int | None = None,
    now: datetime | None = None,
) -> list[Stored]:
    """The newest ``limit`` entries (all, ``None``) that match the filters, newest first.

    The policy's stream is read only without ``job`` and ``gpu`` (its
    entries name neither). ``now``: the reader's clock, where the index is
    read from (``None``: the system clock).
    """
    if limit is not None and limit <= 0:  # nothing to show: nothing to read
        return []
    with_policy = job is None and gpu is None
    if host is not None:
        streams = [host_stream(layout, host), *([policy_stream(layout)] if with_policy else [])]
        page = first_page(limit, len(streams), windowed=since is not None)
        readers = [
            newest_entries(store, s, on_bad, page=page, since=since, first=f)
            for s, f in zip(streams, _first_pages(store, streams, page), strict=True)
        ]
        merged: Iterable[Stored] = heapq.merge(*readers, key=_newest, reverse=True)
    else:
        if limit is not None and with_policy:
            at = now if now is not None else utc_now()
            indexed = read_recent(store, layout, on_bad, limit=limit, now=at, since=since)
            if indexed is not None:
                return indexed
        merged = _fleet_newest(
            store, layout, on_bad, with_policy=with_policy, limit=limit, since=since
        )
    matching = (s for s in merged if select([s], job=job, gpu=gpu, since=since))
    return list(itertools.islice(matching, limit))


_Heap = list[tuple[tuple[int, int], int, Stored, Iterator[Stored]]]


def _fleet_newest(
    store: Store,
    layout: KeyLayout,
    on_bad: OnBad,
    *,
    with_policy: bool,
    limit: int | None,
    since: datetime | None,
) -> Iterator[Stored]:
    """Every stream's entries merged newest first, opening streams only as needed.

    The streams are ranked by their heads' revisions (the newest
    ``want`` heads, more when those are used up). The next entry is shown
    once it is newer than every head not opened yet: none of their entries
    can be newer than their heads.
    """
    want = None if limit is None else max(2 * limit, FIRST_HEADS)
    ranking = _Ranking(store, layout, on_bad, with_policy, want)
    heap: _Heap = []
    batch = FIRST_OPENED
    while True:
        if heap and -heap[0][0][0] > ranking.bound():
            _, tie, stored, reader = heapq.heappop(heap)
            yield stored
            _push(heap, reader, tie)
            continue
        group = ranking.take(batch)
        if not group:
            if heap:  # every stream is open: the rest is the heap's
                continue
            return
        page = first_page(limit, len(group), windowed=since is not None)
        for stream, first in zip(group, _first_pages(store, group, page), strict=True):
            reader = newest_entries(store, stream, on_bad, page=page, since=since, first=first)
            _push(heap, reader, ranking.opened)
            ranking.opened += 1
        batch = min(2 * batch, MAX_TXN_OPS)


class _Ranking:
    """The streams not opened yet, newest head first, read ``want`` heads at a time."""

    def __init__(
        self, store: Store, layout: KeyLayout, on_bad: OnBad, with_policy: bool, want: int | None
    ) -> None:
        self.store, self.layout, self.on_bad = store, layout, on_bad
        self.with_policy, self.want = with_policy, want
        self.opened = 0
        self.seen: set[str] = set()
        self.ranked: list[tuple[int, str | None]] = []  # (head revision, host; None: policy)
        self.complete = False
        self.floor = -1  # no head left unread is newer than this
        self._read()

    def bound(self) -> int:
        """The newest head not opened: an entry newer than this may be shown."""
        top = self.ranked[0][0] if self.ranked else -1
        return top if self.complete else max(top, self.floor)

    def take(self, count: int) -> list[Stream]:
        """Up to ``count`` streams to open, newest head first (reading more heads if needed)."""
        if not self.ranked and not self.complete:
            self.want = None if self.want is None or self.want >= MAX_HEADS else 4 * self.want
            self._read()
        group, self.ranked = self.ranked[:count], self.ranked[count:]
        return [
            host_stream(self.layout, name) if name is not None else policy_stream(self.layout)
            for _, name in group
        ]

    def _read(self) -> None:
        heads, policy_head = self.store.read_many(
            [
                # A key and revision a host: the newest ``want`` of them (etcd sorts).
                Read(
                    self.layout.history_heads,
                    prefix=True,
                    values=False,
                    limit=self.want,
                    newest=self.want is not None,
                ),
                Read(self.layout.policy_history_head, values=False),
            ]
        )
        self.complete = self.want is None or len(heads.items) < self.want
        if heads.items and not self.complete:
            self.floor = min(kv.mod_revision for kv in heads.items)
        ranked: list[tuple[int, str | None]] = [
            (kv.mod_revision, name)
            for kv, name in head_hosts(heads, self.layout, self.on_bad)
            if name not in self.seen
        ]
        if self.with_policy and "" not in self.seen:
            ranked += [(kv.mod_revision, None) for kv in policy_head.items] or [(0, None)]
            self.seen.add("")
        self.seen.update(name for _, name in ranked if name is not None)
        self.ranked = sorted(ranked, key=lambda r: (-r[0], r[1] or ""))


def _push(heap: _Heap, reader: Iterator[Stored], tie: int) -> None:
    """Put ``reader``'s next entry on the (newest first) heap, if it has one."""
    stored = next(reader, None)
    if stored is not None:
        revision, seq = _newest(stored)
        heapq.heappush(heap, ((-revision, -seq), tie, stored, reader))


def _first_pages(store: Store, streams: list[Stream], page: int | None) -> list[Listing]:
    """Every stream's first page, in batches of reads (one request each on etcd)."""
    reads = [Read(s.prefix, prefix=True, limit=page, descending=True) for s in streams]
    pages: list[Listing] = []
    for start in range(0, len(reads), MAX_TXN_OPS):
        pages += store.read_many(reads[start : start + MAX_TXN_OPS])
    return pages


def head_hosts(heads: Listing, layout: KeyLayout, on_bad: OnBad) -> Iterator[tuple[KeyValue, str]]:
    """Each host head key of ``heads`` with its host; a key naming no valid host is reported."""
    for kv in heads.items:
        name = kv.key[len(layout.history_heads) :]
        try:
            validate_name(name, "host")
        except InvalidName:
            on_bad(BadRecord(kv.key, "not a history head key (heads/hosts/<host>)"))
            continue
        yield kv, name


def _newest(stored: Stored) -> tuple[int, int]:
    return stored.revision, stored.entry.seq


def _before(stored: Stored, since: datetime) -> bool:
    at = parse_time(stored.entry.at)
    return at is not None and at < since
