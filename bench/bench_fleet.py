"""A fleet in one process: fan-out of a policy apply, an idle fleet's writes, placement.

* fan-out: ``agents`` simulated agents, each with its own lease, its leased
  agent record and the agent's two watches (its host's assignments, the
  policy), on stores shared by ``AGENTS_PER_CONNECTION`` agents (each watch
  has a connection of its own), all in this process. Each ``policy apply``
  is timed from the moment its transaction is sent to the moment each
  agent's watch has the event;
  baseline: the same apply watched by one watcher alone (interleaved);
* idle writes: the same agents left idle for ``idle`` seconds, each doing
  what the agent's store link does (a keep-alive every heartbeat, a full
  re-read every resync, publishing through the agent's own
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.agent.sync.publisher import Publisher
from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, GpuInfo
from allocator.store import Compare, Event, Op, Put, Read, Store, TxnOutcome, Watch, open_store
from bench.bare_etcd import BareEtcd, b64
from bench.common import Row, percentile, ratio_row, value_row
from bench.fleet import fleet_policy, host_name
from tests.support.etcd_server import EtcdServer

__all__ = ["rows"]

AGENTS_PER_CONNECTION = 50
HEARTBEAT_S, RESYNC_S, LEASE_TTL_S = 10.0, 30.0, 30.0


@dataclass
class SimAgent:
    """One simulated agent: its host, lease publisher and watches."""

    host: str
    store: Store
    publisher: Publisher
    record: bytes
    watches: list[Watch] = field(default_factory=list)
    next_keepalive: float = 0.0
    next_read: float = 0.0


class Arrivals:
    """When each watch's events arrived (stamped where the agent's watch thread wakes)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()

    def attach(self, watch: Watch) -> None:
        """Stamp every batch ``watch`` receives from now on."""
        queue = getattr(watch, "queue", None)
        if queue is None:
            raise SystemExit("the fan-out simulation needs the etcd backend's watches")
        put = queue.put

        def stamped(events: list[Event]) -> None:
            with self._lock:
                self.times.append(time.monotonic())
            put(events)

        queue.put = stamped

    def take(self) -> list[float]:
        """The stamps so far, cleared."""
        with self._lock:
            found, self.times = self.times, []
        return found


def _own_keys(store: Store, layout: KeyLayout, host: str) -> dict[str, Any]:
    listing = store.list(layout.host(host))
    agent = layout.agent(host)
    workers = layout.host_workers(host)
    return {kv.key: kv for kv in listing.items if kv.key == agent or kv.key.startswith(workers)}


def start_agents(
    url: str, layout: KeyLayout, count: int, arrivals: Arrivals, revision: int
) -> tuple[list[SimAgent], list[Store]]:
    """``count`` agents: lease, record, watches on their host's jobs and the policy."""
    stores = [open_store(url) for _ in range(-(-count // AGENTS_PER_CONNECTION))]
    agents = []
    now = time.monotonic()
    for index in range(count):
        host = host_name(index)
        store = stores[index // AGENTS_PER_CONNECTION]
        gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{index:08x}-{g:04x}") for g in range(8))
        record = AgentRecord(host=host, gpus=gpus, pid=index + 1).to_json()
        publisher = Publisher(layout, host, lambda _event, _fields: None)
        agent = SimAgent(host, store, publisher, record)
        publisher.keep_alive(store, LEASE_TTL_S)
        publisher.observe(_own_keys(store, layout, host))
        publisher.publish(store, record, {})
        for prefix in (layout.host_jobs(host), layout.policy):
            watch = store.watch(prefix, revision + 1)
            arrivals.attach(watch)
            agent.watches.append(watch)
        # Spread the heartbeats over the interval, as independent hosts would be.
        agent.next_keepalive = now + HEARTBEAT_S * index / count
        agent.next_read = now + RESYNC_S * index / count
        agents.append(agent)
    return agents, stores


def stop_agents(agents: list[SimAgent], stores: list[Store]) -> None:
    """Close every watch and connection (leases expire on their own)."""
    for agent in agents:
        for watch in agent.watches:
            watch.close()
    for store in stores:
        store.close()


class Applier:
    """Applies policies alternately, noting when each one's transaction is sent."""

    def __init__(self, url: str, prefix: str, hosts: int) -> None:
        self.store = open_store(url)
        self.allocator = Allocator(self.store, prefix=prefix, actor="bench@fleet")
        self.texts = [fleet_policy(hosts, comment=f"v{n}") for n in range(2)]
        self.sent = 0.0
        self.turn = 0
        txn = self.store.txn

        def noted(compares: list[Compare], ops: list[Op]) -> int:
            self.sent = time.monotonic()
            return txn(compares, ops)

        self.store.txn = noted  # type: ignore[method-assign]

    def apply(self) -> float:
        """Apply the other policy; when its transaction was sent."""
        self.turn += 1
        self.allocator.apply_policy(self.texts[self.turn % 2], "fleet.yaml")
        return self.sent

    def close(self) -> None:
        """Close the store."""
        self.store.close()


def _collect(arrivals: Arrivals, expected: int, sent: float, deadline_s: float = 60) -> list[float]:
    deadline = time.monotonic() + deadline_s
    found: list[float] = []
    while len(found) < expected and time.monotonic() < deadline:
        found += arrivals.take()
        time.sleep(0.005)
    found += arrivals.take()
    if len(found) < expected:
        raise SystemExit(f"only {len(found)} of {expected} watchers saw the policy apply")
    return [t - sent for t in found]


def fanout(url: str, count: int, applies: int) -> tuple[Row, list[SimAgent], list[Store]]:
    """Fan-out row; the agents are left running for the idle measurement."""
    fleet, single = KeyLayout("/fleet"), KeyLayout("/single")
    fleet_apply = Applier(url, "/fleet", count)
    single_apply = Applier(url, "/single", count)
    fleet_apply.apply()  # a first policy, before anyone watches
    single_apply.apply()
    start = fleet_apply.store.list("/fleet/").revision
    arrivals, lone = Arrivals(), Arrivals()
    agents, stores = start_agents(url, fleet, count, arrivals, start)
    base_store = open_store(url)
    base_watch = base_store.watch(single.policy, start + 1)
    lone.attach(base_watch)
    ours: list[float] = []
    baseline: list[float] = []
    try:
        for _ in range(applies):
            ours += _collect(arrivals, count, fleet_apply.apply())
            for _ in range(3):
                baseline += _collect(lone, 1, single_apply.apply())
    finally:
        base_watch.close()
        base_store.close()
        fleet_apply.close()
        single_apply.close()
    row = ratio_row(
        f"fleet fan-out, {count} agents, p99",
        ours,
        baseline,
        most=3,
        stat=lambda samples: percentile(samples, 99),
        note=f"{count} agents in one process; median {percentile(ours, 50) * 1000:.1f} ms",
    )
    return row, agents, stores


def idle_writes(url: str, agents: list[SimAgent], seconds: float) -> Row:
    """Revisions per minute while the simulated agents idle as real ones do."""
    layout = KeyLayout("/fleet")
    # The fan-out phase sends no heartbeats, and starting 1,000 agents' watches
    # can outlast a lease: a lease lost meanwhile is granted again and its record
    # put again, as a real agent does once after such a gap, before the window.
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
    """What the agent's store link does when a heartbeat or a re-read is due."""
    if now >= agent.next_read:
        agent.publisher.observe(_own_keys(agent.store, layout, agent.host))
        agent.store.get(layout.policy)
        agent.next_read = now + RESYNC_S
    if now >= agent.next_keepalive:
        agent.publisher.keep_alive(agent.store, LEASE_TTL_S)
        agent.next_keepalive = now + HEARTBEAT_S
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
                    shape.append((len(compares), puts))
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

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def _raw_txn(keys: list[bytes], revisions: list[int], sizes: list[int]) -> dict[str, Any]:
    """Compares on ``keys`` at ``revisions``; puts of ``sizes`` bytes, the first on those keys."""
    targets = [keys[n] if n < len(keys) else keys[0] + b"/put%d" % n for n in range(len(sizes))]
    return {
        "compare": [
            {"key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": str(r)}
            for k, r in zip(keys, revisions, strict=True)
        ],
        "success": [
            {"request_put": {"key": b64(key), "value": b64(b"x" * size)}}
            for key, size in zip(targets, sizes, strict=True)
        ],
    }


def _raw(endpoint: str, clients: int, seconds: float, shape: tuple[int, list[int]]) -> float:
    """Bare JSON-gateway transactions per second of the same size, by ``clients`` threads."""
    compares, sizes = shape
    done = [0] * clients

    def client(index: int) -> None:
        raw = BareEtcd(endpoint)
        try:
            keys = [f"/raw/{index}/c{k}".encode() for k in range(compares)]
            revisions = [raw.put(key, b"0") for key in keys]
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                reply = raw.txn(_raw_txn(keys, revisions, sizes))
                if not reply.get("succeeded"):
                    raise SystemExit("a raw transaction lost its compare")
                written = min(len(keys), len(sizes))
                revisions[:written] = [int(reply["header"]["revision"])] * written
                done[index] += 1
        finally:
            raw.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


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
    compares, sizes = shape[0]
    return ratio_row(
        "placement throughput, 8 clients",
        ours,
        raw,
        least=0.5,
        unit="ops/s",
        scale=1.0,
        note=f"raw txn: {compares} compares, {len(sizes)} puts",
    )


def rows(args: Any, work: Path) -> list[Row]:
    """Fan-out, idle writes and placement rows on one etcd."""
    server = EtcdServer(work / "etcd-fleet")
    server.start()
    try:
        found = [placement(server, args.place_seconds)]
        row, agents, stores = fanout(server.url, args.agents, args.applies)
        found.append(row)
        try:
            found.append(idle_writes(server.url, agents, args.idle))
        finally:
            stop_agents(agents, stores)
        return found
    finally:
        server.stop()
