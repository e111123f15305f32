"""The agent's Prometheus series: names, labels and values from its state (pure)."""

from __future__ import annotations

from allocator.agent.metrics import AgentMetricsState, agent_families
from allocator.gpus.usage import GpuUsage
from allocator.records.types import GpuProcess
from allocator.status.metrics import Histogram, exposition
from tests.support.prometheus import Scrape, parse_exposition

STATE = AgentMetricsState(
    host="node1",
    version="1.2.3",
    uuids={0: "GPU-a", 1: "GPU-b", 2: "GPU-c"},
    unhealthy={2: "XID 79"},
    holders={0: ("train",), 2: ("eval",)},
    usage=(
        GpuUsage(0, 37, memory_used_mib=1024, memory_total_mib=2048),
        GpuUsage(1, None, memory_used_mib=0, memory_total_mib=2048),
        GpuUsage(2, error="GPU is lost"),
    ),
    unassigned=(GpuProcess(gpu=1, pid=77),),
    idle_seconds={"train": 12.5},
    workers={"train": {"pids": [10, 11], "restarts": 5, "change_restarts": 2}},
    store_up=False,
    store_unreachable_seconds=42.0,
)


def _scrape() -> Scrape:
    hist = Histogram("allocator_reconcile_duration_seconds", "h", (0.001, 0.01))
    hist.observe(0.0005)
    hist.observe(0.005)
    return parse_exposition(exposition(lambda: [*agent_families(STATE), hist]).decode())


def test_every_gpu_is_in_exactly_one_state_and_unhealthy_wins() -> None:
    scrape = _scrape()
    for state in ("assigned", "free", "unhealthy"):
        assert scrape.value("allocator_gpus", host="node1", state=state) == 1.0


def test_per_gpu_series_carry_the_holding_job_in_base_units() -> None:
    scrape = _scrape()
    gpu0 = {"host": "node1", "gpu": "0", "uuid": "GPU-a", "job": "train"}
    assert scrape.value("allocator_gpu_utilization_ratio", **gpu0) == 0.37
    assert scrape.value("allocator_gpu_memory_used_bytes", **gpu0) == 2**30
    assert scrape.value("allocator_gpu_memory_total_bytes", **gpu0) == 2**31
    gpu2 = {"host": "node1", "gpu": "2", "uuid": "GPU-c", "job": "eval"}
    assert scrape.value("allocator_gpu_healthy", **gpu2) == 0.0
    # Not measured is absent, never a 0 that would look idle.
    assert [s["gpu"] for s in scrape.with_name("allocator_gpu_utilization_ratio")] == ["0"]


def test_jobs_workers_restarts_store_and_reconcile_series() -> None:
    scrape = _scrape()
    assert scrape.value("allocator_gpu_unassigned_processes", host="node1", gpu="1") == 1.0
    assert scrape.value("allocator_job_idle_seconds", host="node1", job="train") == 12.5
    assert scrape.value("allocator_workers_running", host="node1", job="train") == 2.0
    restarts = {"host": "node1", "job": "train"}
    assert scrape.value("allocator_worker_restarts_total", cause="crash", **restarts) == 3.0
    assert scrape.value("allocator_worker_restarts_total", cause="change", **restarts) == 2.0
    assert scrape.value("allocator_store_up", host="node1") == 0.0
    assert scrape.value("allocator_store_unreachable_seconds", host="node1") == 42.0
    assert scrape.value("allocator_reconcile_duration_seconds_bucket", le="0.001") == 1.0
    assert scrape.value("allocator_reconcile_duration_seconds_count") == 2.0
