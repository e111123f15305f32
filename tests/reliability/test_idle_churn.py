"""An idle agent writes nothing: liveness is the lease's keep-alive, not a rewritten record.

etcd keeps every revision until compaction; an agent that rewrote its ~2 KB
record on every heartbeat would fill a fleet's etcd in hours. Here an agent
with 8 GPUs and three jobs, on a heartbeat of half a second (many keep-alives
and re-reads in the window), idles on a real etcd while the test watches the
store's revision: after settling, it must not move at all.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.store import open_store
from tests.e2e.agent_harness import AgentHarness, agent_policy, pid_alive
from tests.reliability.conftest import Figures, scale
from tests.support.waiting import wait_for

GPUS = 8
#: The jobs the test assigns, and how many workers each runs.
WORKERS = {"train": 1, "ranks": 2, "waiter": 1}


@pytest.fixture
def idle_world(tmp_path: Path, prefix: str, etcd_server_private: Any) -> Iterator[AgentHarness]:
    """An agent on its own etcd (nothing else writes there), with 8 GPUs and three jobs."""
    world = AgentHarness(tmp_path, etcd_server_private.url, prefix, gpus=GPUS)
    settings = tmp_path / "agent.yaml"
    settings.write_text("lease_ttl: 2\nheartbeat_seconds: 0.5\nresync_seconds: 1\n")
    # The GPUs are busy: a job whose GPUs go idle is news (its record says since
    # when), and this test is about an agent with nothing new to say.
    for index in range(GPUS):
        world.gpus.update(index, utilization_gpu=50)
    try:
        world.apply_policy(agent_policy(tmp_path, gpus=GPUS))
        world.start_agent("--config", str(settings))
        yield world
    finally:
        world.cleanup()


def _revision(url: str) -> int:
    store = open_store(url)
    try:
        return store.list("/nothing-here/").revision
    finally:
        store.close()


def _live_workers(world: AgentHarness, job: str) -> set[int]:
    """The pids of ``job``'s live workers, from their own reports (rank N: ``.rankN``)."""
    pids = set()
    for rank in range(WORKERS[job]):
        path = world.workdir / (f"{job}.json" + (f".rank{rank}" if rank else ""))
        try:
            pid = json.loads(path.read_text())["pid"]
        except (FileNotFoundError, ValueError):
            continue
        if pid_alive(pid):
            pids.add(pid)
    return pids


def _settled(world: AgentHarness) -> bool:
    """Every worker runs, and the agent's records (its own, each job's) say so, pid by pid."""
    for job, workers in WORKERS.items():
        record = world.worker_record(job)
        live = _live_workers(world, job)
        if record is None or record.state != "running" or len(live) != workers:
            return False
        if set(record.pids) != live:
            return False
    return world.agent_record_present()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


@pytest.mark.slow
def test_an_idle_agent_does_not_grow_the_store_revision(
    idle_world: AgentHarness, etcd_server_private: Any, figures: Figures
) -> None:
    world = idle_world
    assert world.cli("set", "job=train", "gpus=0,1").code == 0
    assert world.cli("set", "job=ranks", "gpus=2,3").code == 0
    assert world.cli("set", "job=waiter", "gpus=7").code == 0
    # The window opens once the agent has said all there is to say: a write still
    # due then would be growth that no idle agent made.
    wait_for("every worker running and recorded as such", lambda: _settled(world), timeout=30)
    assert world.process is not None
    keepalives = etcd_server_private.requests_served("LeaseKeepAlive", "etcdserverpb.Lease")
    reads = etcd_server_private.requests_served("Range")
    start, cpu = _revision(world.store_url), _cpu_seconds(world.process.pid)
    window = scale(10, 60)
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:  # observe the whole window; the agent must stay quiet
        assert world.process.poll() is None
        time.sleep(0.5)
    growth = _revision(world.store_url) - start
    keepalives = (
        etcd_server_private.requests_served("LeaseKeepAlive", "etcdserverpb.Lease") - keepalives
    )
    reads = etcd_server_private.requests_served("Range") - reads
    cpu = _cpu_seconds(world.process.pid) - cpu
    figures.add("idle window (s)", window)
    figures.add("store revision growth while idle", growth)
    figures.add("lease keep-alives in the window", keepalives)
    figures.add("range reads in the window", reads)
    figures.add("agent CPU while idle (% of a core)", round(100 * cpu / window, 2))
    assert growth == 0
    assert keepalives >= 3  # it was alive and renewing all along, not silent
    assert world.agent_record_present()
    assert _settled(world)
