"""The agent keeps its host's GPU counts in the store, and ``status --summary`` adds them up.

The counts also carry the host's mean GPU utilisation (what ``serve`` plots).

The counts key (``counts/<host>``) lives under the agent's lease: it follows
the host's assignments and health, and goes when the agent does. The summary
counts a host from it instead of reading the host's records, and falls back
to the records for a host without a usable one (no agent, a record not
leased, a damaged one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.host_counts import HostCounts
from allocator.store import Store
from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy
from tests.support.waiting import wait_for

OTHER = "node2"  # declared, 2 GPUs, no agent


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    """An agent on a 4-GPU host; the policy declares a second host with no agent."""
    harness = AgentHarness(tmp_path, store_url, prefix)
    try:
        policy = agent_policy(harness.workdir)
        policy["hosts"][OTHER] = {"gpus": 2}
        harness.apply_policy(policy)
        settings = tmp_path / "agent.yaml"
        settings.write_text("utilisation_report_seconds: 0.1\n")
        harness.start_agent("--config", str(settings))
        yield harness
    finally:
        harness.cleanup()


def _counts(store: Store, world: AgentHarness) -> tuple[HostCounts, int | None] | None:
    item = store.get(world.layout.host_counts(HOST))
    return (HostCounts.from_json(item.value), item.lease) if item is not None else None


def _summary(world: AgentHarness) -> dict[str, Any]:
    result = world.cli("status", "--summary", "-o", "json")
    assert result.code == 0, result.err
    return dict(json.loads(result.out)["total"])


def _counted(store: Store, world: AgentHarness, **fields: int) -> tuple[HostCounts, int | None]:
    """Wait for the host's counts to show ``fields``; return them and their lease."""

    def probe() -> tuple[HostCounts, int | None] | None:
        found = _counts(store, world)
        if found is None or any(getattr(found[0], k) != v for k, v in fields.items()):
            return None
        return found

    return wait_for(f"the agent's counts with {fields}", probe, timeout=20)


def test_the_counts_follow_the_host_and_the_summary_adds_them_up(
    world: AgentHarness, store: Store
) -> None:
    counts, lease = _counted(store, world, held=0)
    assert counts == HostCounts(HOST, (0, 1, 2, 3), free=4, utilisation=0)
    assert lease is not None  # under the agent's lease: gone with it
    for gpu in range(4):  # busy GPUs: the mean the agent reports follows (rounded)
        world.gpus.update(gpu, utilization_gpu=78 + gpu)
    _counted(store, world, utilisation=80)

    assert world.cli("set", f"host={HOST}", "job=train", "gpus=2,3").code == 0
    counts, _ = _counted(store, world, held=2)
    assert counts.free == 2
    world.gpus.add_xid(0, 79)
    _counted(store, world, unhealthy=1, free=1)

    total = _summary(world)  # this host from its counts, the other from its records
    assert {k: total[k] for k in ("hosts", "gpus", "free", "held", "unhealthy")} == {
        "hosts": 2,
        "gpus": 6,
        "free": 3,
        "held": 2,
        "unhealthy": 1,
    }
    assert total["agents_down"] == 1

    world.stop_agent()
    assert _counts(store, world) is None  # withdrawn with the lease


def test_the_summary_uses_leased_counts_and_reads_the_records_of_the_rest(
    world: AgentHarness, store: Store
) -> None:
    _counted(store, world, held=0)
    key = world.layout.host_counts(OTHER)
    forged = HostCounts(OTHER, (0, 1), held=2).to_json()
    world.put_raw(key, forged)  # by hand: no lease, so not an agent's
    assert _summary(world)["held"] == 0 and _summary(world)["agents_down"] == 1

    # An agent's own record, leased: the summary takes it instead of the records.
    store.put(key, forged, lease=store.grant_lease(60))
    assert _summary(world)["held"] == 2 and _summary(world)["agents_down"] == 0
    store.put(key, b'{"host": "node2", "gpus": "many"}', lease=store.grant_lease(60))
    result = world.cli("status", "--summary", "-o", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["total"]["free"] == 6  # counted from the records again
    assert key in result.err  # and the damaged record named
