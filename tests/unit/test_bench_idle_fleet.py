"""The bench's simulated idle agent makes the real agent's requests, as often.

``bench/bench_fleet.py`` measures etcd's cost of an idle fleet with simulated
agents; this holds each one to the real store link's counts over an hour of
fake time (``tests/unit/agent/sync/test_store_thread_pacing.py``: 180
keep-alives and 18 re-reads at 4,000 hosts), so the row measures what a
fleet of real agents would cost.
"""

from __future__ import annotations

from allocator.agent.config import AgentConfig
from allocator.agent.sync.pacing import pacing
from allocator.agent.sync.policy_read import PolicyReader
from allocator.agent.sync.publisher import Publisher
from allocator.control.client import Allocator
from allocator.policy.shares import fleet_size
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord
from allocator.store.memory import MemoryStore
from bench.bench_fleet import SimAgent, _tick
from tests.support.clock import FakeClock
from tests.unit.agent.sync.test_store_thread_pacing import HOUR, Counting, _idle_hour

HOSTS = 4_000


def _simulated_hour(prefix: str) -> Counting:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    policy = f'version: 1\nhosts:\n  "n[0001-{HOSTS:04d}]": {{gpus: 8}}\n'
    Allocator(store, prefix=prefix).apply_policy(policy, "fleet.yaml")
    layout, host = KeyLayout(prefix), "n0001"
    counting = Counting(store)
    paced = pacing(AgentConfig(host=host), fleet_size(HOSTS))
    gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{g:04x}") for g in range(8))
    record = AgentRecord(host=host, gpus=gpus, pid=1).to_json()
    agent = SimAgent(
        host,
        counting,  # type: ignore[arg-type]
        Publisher(layout, host, lambda _event, _fields: None),
        record,
        PolicyReader(layout, host),
        paced,
    )
    agent.publisher.keep_alive(counting, paced.lease_ttl)  # type: ignore[arg-type]
    agent.publisher.publish(counting, record, {})  # type: ignore[arg-type]
    agent.next_keepalive = clock() + paced.heartbeat_seconds
    agent.next_read = clock() + paced.resync_seconds
    counting.calls.clear()
    end = clock() + HOUR
    while clock() < end:
        clock.advance(max(min(agent.next_keepalive, agent.next_read) - clock(), 0.001))
        _tick(agent, layout, clock())
    return counting


def test_the_simulated_agent_idles_as_the_real_store_link_does(prefix: str) -> None:
    simulated = _simulated_hour(prefix).calls
    real = _idle_hour(HOSTS, f"{prefix}real")
    keep_alives = simulated["refresh_lease"] + simulated["grant_lease"]
    assert abs(keep_alives - (real["refresh_lease"] + real["grant_lease"])) <= 2
    assert abs(simulated["read_many"] - real["read_many"]) <= 1
    assert 178 <= keep_alives <= 181 and 17 <= simulated["read_many"] <= 19
