"""History read newest first: what ``history --limit 20`` costs next to reading all of it.

A real etcd holds ``hosts`` streams of ``per_host`` entries (each ~480 B,
written as the library writes them: entry keys and a head per stream).
Ours: :func:`~allocator.control.history_read.query_history` with a limit of
20, fleet-wide, as ``allocator history --limit 20`` and
``/api/v1/history?limit=20`` read; baseline: every entry of every stream
read and decoded, then cut to 20 (what both did before), interleaved.
The second row counts the keys ours read: it is bounded by the limit and
the number of hosts, not by the history's size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from allocator.control.history import Stream, host_stream, read_history, select
from allocator.control.history_read import first_page, query_history
from allocator.errors import BadRecord
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry, HistoryHead
from allocator.store import Listing, Put, Read, Store, open_store
from bench.common import Row, interleaved, ratio_row, value_row
from tests.support.etcd_server import EtcdServer

__all__ = ["rows"]

LIMIT = 20
#: Entries written per transaction (within every backend's 64 operations).
_BATCH = 60


class _Counting:
    """A store that counts the keys its listings returned."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.keys = 0

    def list(self, prefix: str, **options: Any) -> Listing:
        listing = self.store.list(prefix, **options)
        self.keys += len(listing.items)
        return listing

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        found = self.store.read_many(reads)
        self.keys += sum(len(listing.items) for listing in found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _ignore(_bad: BadRecord) -> None:
    pass


def fill(store: Store, layout: KeyLayout, hosts: int, per_host: int) -> None:
    """``hosts`` streams of ``per_host`` entries, the way appends leave them."""
    for index in range(hosts):
        stream = host_stream(layout, f"node{index:05d}")
        for start in range(0, per_host, _BATCH):
            seqs = range(start, min(start + _BATCH, per_host))
            ops = [Put(stream.entry_key(seq), _entry(stream, seq, index).to_json()) for seq in seqs]
            head = HistoryHead(stream.name, 0, seqs[-1] + 1, per_host)
            store.txn([], [*ops, Put(stream.head_key, head.to_json())])


def _entry(stream: Stream, seq: int, index: int) -> HistoryEntry:
    return HistoryEntry(
        seq=seq,
        at=f"2026-06-01T12:{seq // 60 % 60:02d}:{seq % 60:02d}Z",
        by="alice@ops-laptop",
        action="move",
        host=stream.host,
        job=f"train-{seq % 7}",
        from_mode="gpu",
        from_gpus=(index % 8,),
        to_mode="gpu",
        to_gpus=((index + 1) % 8, (index + 2) % 8),
        reason="rebalance after the nightly maintenance window",
    )


def _timed(call: Callable[[], None]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    return run


def rows(args: Any, work: Path) -> list[Row]:
    """The history rows: time against reading everything, and keys read."""
    hosts, per_host = (10, 10) if args.smoke else (100, 200)
    layout = KeyLayout()
    with EtcdServer(work / "etcd-history") as server:
        store = open_store(server.url)
        try:
            fill(store, layout, hosts, per_host)

            def ours() -> None:
                query_history(store, layout, _ignore, limit=LIMIT)

            def everything() -> None:
                select(read_history(store, layout, _ignore))[:LIMIT]

            runs = {"ours": _timed(ours), "baseline": _timed(everything)}
            samples = interleaved(runs, 3 if args.smoke else args.rounds)
            counting = _Counting(store)
            query_history(counting, layout, _ignore, limit=LIMIT)
        finally:
            store.close()
    total = hosts * per_host
    # The heads, every first page, and the pages (each twice the last) the shown came from.
    bound = hosts + hosts * (first_page(LIMIT, hosts + 1) or 0) + 4 * LIMIT
    note = f"{total:,} entries on {hosts} hosts; baseline reads and decodes all of them"
    return [
        ratio_row(
            f"history --limit {LIMIT}, etcd",
            samples["ours"],
            samples["baseline"],
            most=0.5,
            note=note,
        ),
        value_row(f"history --limit {LIMIT}, keys read", counting.keys, bound, "keys", note=note),
    ]
