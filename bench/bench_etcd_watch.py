"""Put and watch latency through allocator's etcd client vs a bare JSON-gateway client.

Starts its own etcd (Debian's ``etcd`` on loopback), then measures, in the
same run and alternating blocks so drift hits both alike:

* put: one ``put`` round trip;
* watch: from the start of a ``put`` until a watch on the key's prefix has
  delivered the event (the latency an agent sees after an operator writes).

Prints p50/p99 in milliseconds for both clients and allocator/bare ratios.
Usage: ``python bench/bench_etcd_watch.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from allocator.store import Store, open_store
from bench.bare_etcd import BareEtcd
from tests.support.etcd_server import EtcdServer

BLOCK = 50
WARMUP = 30


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) of ``samples``, in milliseconds."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))
    return ordered[index] * 1000


def allocator_block(
    store: Store, watch: Any, count: int, puts: list[float], events: list[float]
) -> None:
    """``count`` puts, then ``count`` put-to-event round trips, through the Store."""
    for i in range(count):
        started = time.perf_counter()
        store.put("/bench/alloc/put", str(i).encode())
        puts.append(time.perf_counter() - started)
    for i in range(count):
        started = time.perf_counter()
        store.put("/bench/alloc/w/k", str(i).encode())
        while not watch.next(5.0):
            pass
        events.append(time.perf_counter() - started)


def bare_block(
    client: BareEtcd, batches: Iterator[Any], count: int, puts: list[float], events: list[float]
) -> None:
    """The same, with a bare client of the gateway (:mod:`bench.bare_etcd`)."""
    for i in range(count):
        started = time.perf_counter()
        client.put(b"/bench/bare/put", str(i).encode())
        puts.append(time.perf_counter() - started)
    for i in range(count):
        started = time.perf_counter()
        client.put(b"/bench/bare/w/k", str(i).encode())
        while not next(batches):
            pass
        events.append(time.perf_counter() - started)


def report(name: str, ours: list[float], bare: list[float]) -> None:
    """Print one line: p50/p99 of both and the ratios."""
    o50, o99 = percentile(ours, 50), percentile(ours, 99)
    b50, b99 = percentile(bare, 50), percentile(bare, 99)
    print(
        f"{name:6s} allocator p50 {o50:6.2f} ms p99 {o99:6.2f} ms | "
        f"bare client p50 {b50:6.2f} ms p99 {b99:6.2f} ms | "
        f"ratio p50 {o50 / b50:4.2f}x p99 {o99 / b99:4.2f}x"
    )


def run(server: EtcdServer, rounds: int) -> None:
    """Alternate blocks of allocator and bare measurements; print the summary."""
    client = BareEtcd(server.endpoint, timeout=5)
    bare_events = client.watch(b"/bench/bare/w/")
    store = open_store(server.url)
    watch = store.watch("/bench/alloc/w/", store.list("/bench/").revision + 1)
    try:
        allocator_block(store, watch, WARMUP, [], [])
        bare_block(client, bare_events, WARMUP, [], [])
        ours_put: list[float] = []
        ours_event: list[float] = []
        bare_put: list[float] = []
        bare_event: list[float] = []
        for _ in range(max(1, rounds // BLOCK)):
            allocator_block(store, watch, BLOCK, ours_put, ours_event)
            bare_block(client, bare_events, BLOCK, bare_put, bare_event)
        print(f"{len(ours_put)} samples each, etcd {server.endpoint}")
        report("put", ours_put, bare_put)
        report("watch", ours_event, bare_event)
    finally:
        watch.close()
        store.close()
        client.close()


def main() -> None:
    """Start etcd, measure, stop etcd."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="samples per measurement")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-etcd-") as data,
        EtcdServer(Path(data)) as server,
    ):
        run(server, args.rounds)


if __name__ == "__main__":
    main()
