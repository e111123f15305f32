"""Reading history newest first, at the cost of what is shown.

Entry keys sort by sequence number, so a stream's newest entries are the
first keys of a descending range read with a limit (every backend's
``list(prefix, limit=, descending=True)``). A stream is read in pages,
each twice the size of the one before, so a reader that needs ``n`` entries
reads fewer than ``2n`` (plus its first page) however long the stream is;
a ``--since`` window ends a stream's reading at its first older entry.

The fleet's history is every host's stream and the policy's, merged newest
first (by the revision that wrote each entry, as :func:`read_history`
sorts). The merge pulls from a stream only when its newest unread entry is
next, so with a limit the streams are read only as far as their entries
are shown: a fleet of ``h`` hosts costs one small read per host (batched,
64 to a request) plus the pages the shown entries came from. (A fleet-wide index, one more key per
entry written in the same transaction, was measured against this and not
needed: see ``bench/bench_history.py``.)
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator
from datetime import datetime

from allocator.control.history import (
    OnBad,
    Stored,
    Stream,
    decode_entry,
    host_stream,
    policy_stream,
    select,
)
from allocator.errors import BadRecord, InvalidName
from allocator.records.keys import KeyLayout, validate_name
from allocator.store import MAX_TXN_OPS, Listing, Read, Store
from allocator.util.times import parse_time

__all__ = ["MAX_PAGE", "SINCE_PAGE", "first_page", "newest_entries", "query_history"]

#: The largest page read at once: a stream's 1,000 entries are ~480 KB.
MAX_PAGE = 1024
#: The first page of a ``--since`` read without a limit: the window decides how far.
SINCE_PAGE = 8


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
) -> list[Stored]:
    """The newest ``limit`` entries (all, ``None``) that match the filters, newest first.

    The policy's stream is read only without ``job`` and ``gpu`` (its
    entries name neither).
    """
    streams = [host_stream(layout, name) for name in _hosts(store, layout, host, on_bad)]
    if job is None and gpu is None:
        streams.append(policy_stream(layout))
    page = first_page(limit, len(streams), windowed=since is not None)
    firsts = _first_pages(store, streams, page)
    readers = [
        newest_entries(store, s, on_bad, page=page, since=since, first=f)
        for s, f in zip(streams, firsts, strict=True)
    ]
    merged: Iterable[Stored] = heapq.merge(*readers, key=_newest, reverse=True)
    matching = (s for s in merged if select([s], job=job, gpu=gpu, since=since))
    return list(itertools.islice(matching, limit))


def _first_pages(store: Store, streams: list[Stream], page: int | None) -> list[Listing]:
    """Every stream's first page, in batches of reads (one request each on etcd)."""
    reads = [Read(s.prefix, prefix=True, limit=page, descending=True) for s in streams]
    pages: list[Listing] = []
    for start in range(0, len(reads), MAX_TXN_OPS):
        pages += store.read_many(reads[start : start + MAX_TXN_OPS])
    return pages


def _hosts(store: Store, layout: KeyLayout, host: str | None, on_bad: OnBad) -> list[str]:
    if host is not None:
        return [host]
    names = []
    for kv in store.list(layout.history_heads).items:  # one small key a host
        name = kv.key[len(layout.history_heads) :]
        try:
            validate_name(name, "host")
        except InvalidName:
            on_bad(BadRecord(kv.key, "not a history head key (heads/hosts/<host>)"))
            continue
        names.append(name)
    return sorted(names)


def _newest(stored: Stored) -> tuple[int, int]:
    return stored.revision, stored.entry.seq


def _before(stored: Stored, since: datetime) -> bool:
    at = parse_time(stored.entry.at)
    return at is not None and at < since
