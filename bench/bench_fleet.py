"""A fleet in one process: an idle fleet's writes, placement.

(What a policy apply costs the fleet, its fan-out to every agent, is
:mod:`bench.bench_fanout`: its watchers need processes of their own.)

* idle writes: ``agents`` simulated agents, each with its own lease and its
  leased agent record, on stores shared by ``AGENTS_PER_CONNECTION``
  agents, left idle for ``idle`` seconds, each doing what the agent's store
  link does (a keep-alive every heartbeat, a re-read every resync,
  publishing through the agent's own
  :class:`~allocator.agent.sync.publisher.Publisher`); the store's revisions
  per minute count every write;
* placement: 8 threads assigning on distinct hosts through the library
  (``Allocator.assign``) vs 8 threads of a bare JSON-gateway client
  (:mod:`bench.bare_etcd`) sending transactions of the same size (compares
  and writes) as the library's, for the same time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from allocator.agent.config import AgentConfig
from allocator.agent.sync.pacing import Pacing, pacing
from allocator.agent.sync.policy_read import PolicyReader
from allocator.agent.sync.publisher import Publisher
from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.policy.shares import fleet_size
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord
from allocator.store import (
    Compare,
    Delete,
    Listing,
    Op,
    Put,
    Read,
    Store,
    TxnOutcome,
    open_store,
)
from bench.bare_etcd import BareEtcd, b64
from bench.common import Row, ratio_row, value_row
from bench.fleet import fleet_policy, host_name
from tests.support.etcd_server import EtcdServer

__all__ = ["rows"]

AGENTS_PER_CONNECTION = 50
#: The most of a core an idle fleet may cost etcd (issue target at 12,500 agents).
IDLE_ETCD_CORES = 0.4
#: The large idle fleet the target is stated at.
IDLE_AGENTS = 12_500


@dataclass
class SimAgent:
    """One simulated agent: its host, its lease's publisher and its record."""

    host: str
    store: Store
    publisher: Publisher
    record: bytes
    reader: PolicyReader
    paced: Pacing
    next_keepalive: float = 0.0
    next_read: float = 0.0


def _own_keys(store: Store, layout: KeyLayout, host: str) -> dict[str, Any]:
    return _own_keys_of(store.list(layout.host(host)), layout, host)


def _own_keys_of(listing: Listing, layout: KeyLayout, host: str) -> dict[str, Any]:
    agent = layout.agent(host)
    workers = layout.host_workers(host)
    return {kv.key: kv for kv in listing.items if kv.key == agent or kv.key.startswith(workers)}


def start_agents(url: str, layout: KeyLayout, count: int) -> tuple[list[SimAgent], list[Store]]:
    """``count`` agents, each with its lease and its leased record."""
    stores = [open_store(url) for _ in range(-(-count // AGENTS_PER_CONNECTION))]
    # The real agent's pacing, from the fleet's size as the policy's common share says it.
    paced = pacing(AgentConfig(host=host_name(0)), fleet_size(count))
    agents = []
    now = time.monotonic()
    for index in range(count):
        host = host_name(index)
        store = stores[index // AGENTS_PER_CONNECTION]
        gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{index:08x}-{g:04x}") for g in range(8))
        record = AgentRecord(host=host, gpus=gpus, pid=index + 1).to_json()
        publisher = Publisher(layout, host, lambda _event, _fields: None)
        agent = SimAgent(host, store, publisher, record, PolicyReader(layout, host), paced)
        publisher.keep_alive(store, paced.lease_ttl)
        publisher.observe(_own_keys(store, layout, host))
        publisher.publish(store, record, {})
        # Spread the heartbeats over the interval, as independent hosts would be.
        agent.next_keepalive = now + paced.heartbeat_seconds * index / count
        agent.next_read = now + paced.resync_seconds * index / count
        agents.append(agent)
    return agents, stores


def stop_agents(stores: list[Store]) -> None:
    """Close every connection (leases expire on their own)."""
    for store in stores:
        store.close()


def idle_fleet(url: str, count: int, seconds: float, etcd_pid: int | None = None) -> list[Row]:
    """``count`` agents under the fleet's policy, idle for ``seconds``: writes, etcd's CPU."""
    store = open_store(url)
    try:
        Allocator(store, prefix="/fleet", actor="bench@fleet").apply_policy(
            fleet_policy(count), "fleet.yaml"
        )
    finally:
        store.close()
    agents, stores = start_agents(url, KeyLayout("/fleet"), count)
    try:
        etcd = psutil.Process(etcd_pid) if etcd_pid is not None else None
        before = sum(etcd.cpu_times()[:2]) if etcd is not None else 0.0
        started = time.monotonic()
        found = [idle_writes(url, agents, seconds)]
        if etcd is not None:
            cores = (sum(etcd.cpu_times()[:2]) - before) / (time.monotonic() - started)
            found.append(
                value_row(
                    f"etcd CPU, {count} idle agents",
                    cores,
                    IDLE_ETCD_CORES,
                    "cores",
                    note="keep-alives, re-reads paced as the agent's (agent/sync/pacing.py)",
                )
            )
        return found
    finally:
        stop_agents(stores)


def idle_writes(url: str, agents: list[SimAgent], seconds: float) -> Row:
    """Revisions per minute while the simulated agents idle as real ones do."""
    layout = KeyLayout("/fleet")
    # Starting 1,000 agents can outlast a lease: a lease lost meanwhile is granted
    # again and its record put again, as a real agent does once after such a gap,
    # before the window.
    for agent in agents:
        agent.next_keepalive = 0.0
        _tick(agent, layout, time.monotonic())
    probe = open_store(url)
    try:
        before = probe.list(layout.policy).revision
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            for agent in agents:
                _tick(agent, layout, now)
            time.sleep(0.05)
        after = probe.list(layout.policy).revision
    finally:
        probe.close()
    per_minute = (after - before) * 60 / (time.monotonic() - started)
    hosts = len(agents)
    return value_row(
        f"etcd write rate, {hosts} idle agents",
        per_minute,
        hosts / 10,
        "revisions/min",
        note="target: 1 per host per 10 minutes",
    )


def _tick(agent: SimAgent, layout: KeyLayout, now: float) -> None:
    """What the agent's store link does when a heartbeat or a re-read is due.

    The re-read is the real agent's (``PolicyReader.read``: the host's keys and
    the policy's revisions in one request), at the real agent's pacing.
    """
    if now >= agent.next_read:
        listing, _ = agent.reader.read(agent.store)
        agent.publisher.observe(_own_keys_of(listing, layout, agent.host))
        agent.next_read = now + agent.paced.resync_seconds
    if now >= agent.next_keepalive:
        agent.publisher.keep_alive(agent.store, agent.paced.lease_ttl)
        agent.next_keepalive = now + agent.paced.heartbeat_seconds
    agent.publisher.publish(agent.store, agent.record, {})


# --- placement throughput ---------------------------------------------------------------


def _ours(url: str, clients: int, seconds: float, shape: list[Any]) -> float:
    """Assignments per second by ``clients`` threads, each on its own host."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        store = open_store(url)
        if index == 0:
            write = store.txn_or_read

            def noted(compares: list[Compare], ops: list[Op], reads: list[Read]) -> TxnOutcome:
                if not shape:
                    puts = [len(op.value) for op in ops if isinstance(op, Put)]
                    # The history index's trim: a prefix delete, nearly always of nothing.
                    deletes = sum(1 for op in ops if isinstance(op, Delete))
                    shape.append((len(compares), puts, deletes))
                return write(compares, ops, reads)

            store.txn_or_read = noted  # type: ignore[method-assign]
        allocator = Allocator(store, prefix="/place", actor="bench@place")
        host = host_name(index)
        try:
            while time.monotonic() < stop:
                allocator.assign(Request(job=f"place{index}", host=host, gpus=(done[index] % 8,)))
                done[index] += 1
        finally:
            store.close()

    return _per_second(client, done)


def _per_second(client: Callable[[int], None], done: list[int]) -> float:
    """Runs ``client(i)`` in one thread per item of ``done`` at once: ``done``'s sum per second."""
    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(done))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def _raw_txn(
    keys: list[bytes], revisions: list[int], sizes: list[int], deletes: int = 0
) -> dict[str, Any]:
    """Compares on ``keys`` at ``revisions``; puts of ``sizes`` bytes, the first on those keys;
    ``deletes`` prefix deletes of empty ranges."""
    targets = [keys[n] if n < len(keys) else keys[0] + b"/put%d" % n for n in range(len(sizes))]
    gone = [keys[0] + b"/gone%d/" % n for n in range(deletes)]
    return {
        "compare": [
            {"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": str(r)}
            for k, r in zip(keys, revisions, strict=True)
        ],
        "success": [
            *(
                {"request_put": {"key": b64(key), "value": b64(b"x" * size)}}
                for key, size in zip(targets, sizes, strict=True)
            ),
            *(
                {"request_delete_range": {"key": b64(key), "range_end": b64(_after(key))}}
                for key in gone
            ),
        ],
    }


def _after(prefix: bytes) -> bytes:
    """The end of the key range of ``prefix`` (its last byte plus one; ASCII prefixes here)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _raw(endpoint: str, clients: int, seconds: float, shape: tuple[int, list[int], int]) -> float:
    """Bare JSON-gateway transactions per second of the same shape, by ``clients`` threads."""
    compares, sizes, deletes = shape
    done = [0] * clients

    def client(index: int) -> None:
        raw = BareEtcd(endpoint)
        try:
            keys = [f"/raw/{index}/c{k}".encode() for k in range(compares)]
            revisions = [raw.put(key, b"0") for key in keys]
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                reply = raw.txn(_raw_txn(keys, revisions, sizes, deletes))
                if not reply.get("succeeded"):
                    raise SystemExit("a raw transaction lost its compare")
                written = min(len(keys), len(sizes))
                revisions[:written] = [int(reply["header"]["revision"])] * written
                done[index] += 1
        finally:
            raw.close()

    return _per_second(client, done)


def placement(server: EtcdServer, seconds: float) -> Row:
    """Library assignments vs raw transactions, per second, in alternating windows."""
    store = open_store(server.url)
    try:
        Allocator(store, prefix="/place").apply_policy(fleet_policy(8), "place.yaml")
    finally:
        store.close()
    shape: list[Any] = []
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(2):
        ours.append(_ours(server.url, 8, seconds, shape))
        raw.append(_raw(server.endpoint, 8, seconds, shape[0]))
    compares, sizes, deletes = shape[0]
    return ratio_row(
        "placement throughput, 8 clients",
        ours,
        raw,
        least=0.5,
        unit="ops/s",
        scale=1.0,
        note=f"raw txn: {compares} compares, {len(sizes)} puts, {deletes} prefix deletes",
    )


def rows(args: Any, work: Path) -> list[Row]:
    """Placement and idle-write rows on one etcd."""
    server = EtcdServer(work / "etcd-fleet")
    server.start()
    try:
        found = [placement(server, args.place_seconds)]
        found += idle_fleet(server.url, args.agents, args.idle, server.pid)
    finally:
        server.stop()
    return found + _large_idle_fleet(args, work)


def _large_idle_fleet(args: Any, work: Path) -> list[Row]:
    """The idle rows at :data:`IDLE_AGENTS` agents, on an etcd of their own, over a heartbeat.

    At this size the agents' pacing stretches the heartbeat (about a minute at
    12,500): the window holds one whole heartbeat, so every agent's
    keep-alive and its share of re-reads fall in it.
    """
    count = 30 if args.smoke else IDLE_AGENTS
    paced = pacing(AgentConfig(host=host_name(0)), fleet_size(count))
    window = args.idle if args.smoke else max(args.idle, 1.2 * paced.heartbeat_seconds)
    server = EtcdServer(work / "etcd-idle-fleet")
    server.start()
    try:
        return idle_fleet(server.url, count, window, server.pid)
    finally:
        server.stop()
