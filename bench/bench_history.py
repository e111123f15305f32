"""History read newest first: what ``history --limit 20`` costs next to reading all of it.

A real etcd holds ``hosts`` streams of ``per_host`` entries (each ~480 B,
written as the library writes them: entry keys and a head per stream).
Ours: :func:`~allocator.history.read.query_history` with a limit of
20, fleet-wide, as ``allocator history --limit 20`` and
``/api/v1/history?limit=20`` read; baseline: every entry of every stream
read and decoded, then cut to 20 (what both did before), interleaved.
The second row counts the keys ours read: it is bounded by the limit, not
by the history's size or the number of hosts.

The scale rows (:func:`scale_rows`) time the same read on 1,000,000
entries (25,000 hosts of 40, a little more than the default keeps at that size)
against 1,000 (25 hosts of 40), each in its own etcd, fleet-wide and for one
host: what the read costs must not grow with the history. Loading the
million takes a few minutes (60 entries a transaction, four writers, etcd
without fsync: the load is not what is measured).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from allocator.errors import BadRecord
from allocator.history.index import pointer_key
from allocator.history.read import first_page, query_history
from allocator.history.stream import Stream, host_stream, read_history, select
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry, HistoryHead
from allocator.store import Put, Store, open_store
from allocator.util.times import format_time
from bench.common import Row, interleaved, ratio_row, value_row
from tests.support.etcd_server import EtcdServer
from tests.support.reads import CountingStore

__all__ = ["rows"]

LIMIT = 20
#: Keys written per transaction (within every backend's 64 operations).
_BATCH = 60
#: The time of entry 0 of host 0; entry ``seq`` of host ``index`` is ``seq * hosts + index`` s on.
_START = datetime(2026, 6, 1, tzinfo=UTC)


def _ignore(_bad: BadRecord) -> None:
    pass


def fill(
    store: Store,
    layout: KeyLayout,
    hosts: int,
    per_host: int,
    first: int = 0,
    fleet: int | None = None,
) -> None:
    """``hosts`` streams of ``per_host`` entries, the way appends leave them.

    Each entry with its pointer in the fleet's index (every one kept: the
    index as large as it gets), packed into transactions of about
    :data:`_BATCH` keys. ``fleet``: the hosts of the whole fleet (``hosts``
    unless a share of it), for the entries' times: one a second, host by host.
    """
    stride = fleet if fleet is not None else hosts
    ops: list[Put] = []
    for index in range(first, first + hosts):
        stream = host_stream(layout, f"node{index:05d}")
        for start in range(0, per_host, _BATCH // 2):
            seqs = range(start, min(start + _BATCH // 2, per_host))
            if len(ops) + 2 * len(seqs) + 1 > _BATCH + 3:
                store.txn([], ops)
                ops = []
            for seq in seqs:
                entry = _entry(stream, seq, index, seq * stride + index)
                ops.append(Put(stream.entry_key(seq), entry.to_json()))
                pointer = pointer_key(layout.history, entry.at, stream.entry_key(seq))
                ops += [Put(pointer, b"")] if pointer is not None else []
            head = HistoryHead(stream.name, 0, seqs[-1] + 1, per_host)
            ops.append(Put(stream.head_key, head.to_json()))
    if ops:
        store.txn([], ops)


def fill_parallel(url: str, layout: KeyLayout, hosts: int, per_host: int, writers: int) -> None:
    """:func:`fill` by ``writers`` connections at once, each its share of the hosts."""
    share = -(-hosts // writers)

    def one(first: int) -> None:
        store = open_store(url)
        try:
            fill(store, layout, min(share, hosts - first), per_host, first, hosts)
        finally:
            store.close()

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(one, range(0, hosts, share)))


def _entry(stream: Stream, seq: int, index: int, second: int) -> HistoryEntry:
    return HistoryEntry(
        seq=seq,
        at=format_time(_START + timedelta(seconds=second)),
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


def _reader_clock(hosts: int, per_host: int) -> datetime:
    """A reader's clock a few seconds after the newest entry :func:`fill` writes."""
    return _START + timedelta(seconds=per_host * hosts + 5)


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

            now = _reader_clock(hosts, per_host)

            def ours() -> None:
                query_history(store, layout, _ignore, limit=LIMIT, now=now)

            def everything() -> None:
                select(read_history(store, layout, _ignore))[:LIMIT]

            runs = {"ours": _timed(ours), "baseline": _timed(everything)}
            samples = interleaved(runs, 3 if args.smoke else args.rounds)
            counting = CountingStore(store)
            query_history(counting, layout, _ignore, limit=LIMIT, now=now)
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
        value_row(
            f"history --limit {LIMIT}, keys read", counting.keys_read, bound, "keys", note=note
        ),
    ]


#: (hosts, entries a host) of the large history and of the small one, per mode.
_SCALE = {"full": ((25_000, 40), (25, 40)), "smoke": ((30, 4), (5, 2))}


def scale_rows(args: Any, work: Path) -> list[Row]:
    """``history --limit 20`` (fleet-wide, and ``host=``) on 1,000,000 entries against 1,000."""
    (big_hosts, big_per), (small_hosts, small_per) = _SCALE["smoke" if args.smoke else "full"]
    layout = KeyLayout()
    fast = ("--unsafe-no-fsync", "--quota-backend-bytes=4294967296")
    with (
        EtcdServer(work / "etcd-history-big", extra_args=fast) as big,
        EtcdServer(work / "etcd-history-small", extra_args=fast) as small,
    ):
        started = time.perf_counter()
        fill_parallel(big.url, layout, big_hosts, big_per, writers=4)
        loaded = time.perf_counter() - started
        stores = {"big": open_store(big.url), "small": open_store(small.url)}
        try:
            fill(stores["small"], layout, small_hosts, small_per)
            runs: dict[str, Callable[[], float]] = {}
            clocks = {
                "big": _reader_clock(big_hosts, big_per),
                "small": _reader_clock(small_hosts, small_per),
            }
            for name, store in stores.items():
                runs[name] = _timed(_reader(store, layout, None, clocks[name]))
                runs[f"{name} host"] = _timed(_reader(store, layout, "node00003", clocks[name]))
            samples = interleaved(runs, 3 if args.smoke else args.rounds)
        finally:
            for store in stores.values():
                store.close()
    big_total, small_total = big_hosts * big_per, small_hosts * small_per
    note = (
        f"{big_total:,} entries ({big_hosts:,} hosts of {big_per}) against {small_total:,} "
        f"({small_hosts} of {small_per}), each in its own etcd; loading took {loaded:.0f} s"
    )
    title = f"history --limit {LIMIT}, {big_total:,} entries vs {small_total:,} entries"
    return [
        ratio_row(title, samples["big"], samples["small"], most=2.0, note=note),
        ratio_row(
            f"{title}, host=", samples["big host"], samples["small host"], most=2.0, note=note
        ),
    ]


def _reader(store: Store, layout: KeyLayout, host: str | None, now: datetime) -> Callable[[], None]:
    def read() -> None:
        query_history(store, layout, _ignore, host=host, limit=LIMIT, now=now)

    return read
