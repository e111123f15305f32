"""The agent's Prometheus series, computed from its state at scrape time (pure).

Per host: GPUs by state (assigned, free, unhealthy: each GPU in exactly one),
each GPU's utilization and memory with the holding job as a label, the
processes on GPUs nobody was given, how long each job has been idle,
workers running and restarts by cause per job, whether the store is
reachable and for how long it has not been, and how long a reconcile
takes (a histogram kept by :class:`allocator.agent.gpu_care.observe.Observer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from allocator.gpus.usage import GpuUsage
from allocator.records.types import GpuProcess
from allocator.status.metrics import Family

__all__ = ["AgentMetricsState", "agent_families"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class AgentMetricsState:
    """What the agent knows, as of its last step."""

    host: str
    version: str = ""
    uuids: Mapping[int, str | None] = field(default_factory=dict)  # the inventory
    unhealthy: Mapping[int, str] = field(default_factory=dict)
    holders: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    usage: Sequence[GpuUsage] | None = None
    unassigned: Sequence[GpuProcess] = ()
    idle_seconds: Mapping[str, float] = field(default_factory=dict)
    workers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # supervisor records
    store_up: bool = False
    store_unreachable_seconds: float = 0.0


def agent_families(state: AgentMetricsState) -> list[Family]:
    """Every series the agent exports (the reconcile histogram apart)."""
    return [
        Family(
            "allocator_agent_info",
            "gauge",
            "The agent's version.",
            ("host", "version"),
            [((state.host, state.version), 1.0)],
        ),
        _gpus_by_state(state),
        *_per_gpu(state),
        _unassigned(state),
        Family(
            "allocator_job_idle_seconds",
            "gauge",
            "How long all of a job's GPUs have been under its idle threshold (absent: busy).",
            ("host", "job"),
            [((state.host, job), s) for job, s in sorted(state.idle_seconds.items())],
        ),
        *_workers(state),
        Family(
            "allocator_store_up",
            "gauge",
            "1 while the agent reaches the store.",
            ("host",),
            [((state.host,), 1.0 if state.store_up else 0.0)],
        ),
        Family(
            "allocator_store_unreachable_seconds",
            "gauge",
            "Seconds since the store was last reachable (0 while it is).",
            ("host",),
            [((state.host,), 0.0 if state.store_up else state.store_unreachable_seconds)],
        ),
    ]


def _gpu_state(state: AgentMetricsState, index: int) -> str:
    if index in state.unhealthy:
        return "unhealthy"
    return "assigned" if state.holders.get(index) else "free"


def _gpus_by_state(state: AgentMetricsState) -> Family:
    counts = {"assigned": 0, "free": 0, "unhealthy": 0}
    for index in state.uuids:
        counts[_gpu_state(state, index)] += 1
    return Family(
        "allocator_gpus",
        "gauge",
        "GPUs of this host by state (unhealthy wins over assigned).",
        ("host", "state"),
        [((state.host, name), float(count)) for name, count in counts.items()],
    )


def _per_gpu(state: AgentMetricsState) -> list[Family]:
    labels = ("host", "gpu", "uuid", "job")
    utilization: list[tuple[tuple[str, ...], float]] = []
    used: list[tuple[tuple[str, ...], float]] = []
    total: list[tuple[tuple[str, ...], float]] = []
    healthy: list[tuple[tuple[str, ...], float]] = []
    by_index = {u.index: u for u in state.usage or () if not u.error}
    for index, uuid in sorted(state.uuids.items()):
        values = (state.host, str(index), uuid or "", ",".join(state.holders.get(index, ())))
        healthy.append((values, 0.0 if index in state.unhealthy else 1.0))
        sample = by_index.get(index)
        if sample is None:
            continue
        if sample.utilization_percent is not None:
            utilization.append((values, sample.utilization_percent / 100.0))
        if sample.memory_used_mib is not None:
            used.append((values, float(sample.memory_used_mib * _MIB)))
        if sample.memory_total_mib is not None:
            total.append((values, float(sample.memory_total_mib * _MIB)))
    return [
        Family("allocator_gpu_healthy", "gauge", "1 while the GPU is in service.", labels, healthy),
        Family(
            "allocator_gpu_utilization_ratio",
            "gauge",
            "Fraction of the last NVML sample period a kernel ran on the GPU.",
            labels,
            utilization,
        ),
        Family("allocator_gpu_memory_used_bytes", "gauge", "GPU memory in use.", labels, used),
        Family("allocator_gpu_memory_total_bytes", "gauge", "GPU memory in all.", labels, total),
    ]


def _unassigned(state: AgentMetricsState) -> Family:
    counts: dict[int, int] = {index: 0 for index in state.uuids}
    for process in state.unassigned:
        counts[process.gpu] = counts.get(process.gpu, 0) + 1
    return Family(
        "allocator_gpu_unassigned_processes",
        "gauge",
        "Processes on the GPU that no job running there was given.",
        ("host", "gpu"),
        [((state.host, str(index)), float(n)) for index, n in sorted(counts.items())],
    )


def _workers(state: AgentMetricsState) -> list[Family]:
    running: list[tuple[tuple[str, ...], float]] = []
    restarts: list[tuple[tuple[str, ...], float]] = []
    for job, record in sorted(state.workers.items()):
        running.append(((state.host, job), float(len(record.get("pids", ())))))
        total = int(record.get("restarts", 0))
        change = int(record.get("change_restarts", 0))
        restarts.append(((state.host, job, "crash"), float(max(0, total - change))))
        restarts.append(((state.host, job, "change"), float(change)))
    return [
        Family(
            "allocator_workers_running",
            "gauge",
            "Live worker processes of each job.",
            ("host", "job"),
            running,
        ),
        Family(
            "allocator_worker_restarts",
            "counter",
            "Worker restarts by cause: crash (crash-loop restarts) or change (of the assignment).",
            ("host", "job", "cause"),
            restarts,
        ),
    ]
