"""Put and watch latency through allocator's etcd backend vs a bare aetcd client.

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
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aetcd

from allocator.store import Store, open_store
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


async def bare_block(
    client: Any, events_iter: Any, count: int, puts: list[float], events: list[float]
) -> None:
    """The same, with aetcd used directly on its own event loop."""
    for i in range(count):
        started = time.perf_counter()
        await client.put(b"/bench/bare/put", str(i).encode())
        puts.append(time.perf_counter() - started)
    for i in range(count):
        started = time.perf_counter()
        await client.put(b"/bench/bare/w/k", str(i).encode())
        await asyncio.wait_for(events_iter.__anext__(), 5.0)
        events.append(time.perf_counter() - started)


def report(name: str, ours: list[float], bare: list[float]) -> None:
    """Print one line: p50/p99 of both and the ratios."""
    o50, o99 = percentile(ours, 50), percentile(ours, 99)
    b50, b99 = percentile(bare, 50), percentile(bare, 99)
    print(
        f"{name:6s} allocator p50 {o50:6.2f} ms p99 {o99:6.2f} ms | "
        f"bare aetcd p50 {b50:6.2f} ms p99 {b99:6.2f} ms | "
        f"ratio p50 {o50 / b50:4.2f}x p99 {o99 / b99:4.2f}x"
    )


def run(server: EtcdServer, rounds: int) -> None:
    """Alternate blocks of allocator and bare measurements; print the summary."""
    loop = asyncio.new_event_loop()
    client = aetcd.Client(host="127.0.0.1", port=server.client_port, timeout=5)
    bare_watch = loop.run_until_complete(client.watch_prefix(b"/bench/bare/w/"))
    bare_events = bare_watch.__aiter__()
    store = open_store(server.url)
    watch = store.watch("/bench/alloc/w/", store.list("/bench/").revision + 1)
    try:
        allocator_block(store, watch, WARMUP, [], [])
        loop.run_until_complete(bare_block(client, bare_events, WARMUP, [], []))
        ours_put: list[float] = []
        ours_event: list[float] = []
        bare_put: list[float] = []
        bare_event: list[float] = []
        for _ in range(max(1, rounds // BLOCK)):
            allocator_block(store, watch, BLOCK, ours_put, ours_event)
            loop.run_until_complete(bare_block(client, bare_events, BLOCK, bare_put, bare_event))
        print(f"{len(ours_put)} samples each, etcd {server.endpoint}")
        report("put", ours_put, bare_put)
        report("watch", ours_event, bare_event)
    finally:
        watch.close()
        store.close()
        loop.run_until_complete(bare_watch.cancel())
        loop.run_until_complete(client.close())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


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
