"""Which CPUs (and NUMA memory) each worker is pinned to (pure).

A GPU worker runs on the CPUs local to its GPUs (NVML's ideal CPU affinity,
published in the agent's inventory), within the CPUs the agent itself may
use; its memory is bound to its GPUs' NUMA nodes where ``numactl`` is
installed. A worker on CPU fallback gets as many CPUs as its rule's
``threads``: CPU jobs are laid out one after another over the agent's CPUs
(by job name), so two of them share CPUs only when there are not enough.
A job with ``cpu_affinity: none``, or a worker whose GPUs say nothing about
their CPUs, is left unpinned.

The CPU set is not part of a worker's fingerprint: a new agent pins workers
as it starts them, and never restarts a running job to re-pin it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from allocator.agent.planning.types import DesiredJob, WorkerSpec
from allocator.gpus.topology import parse_cpu_list
from allocator.policy.model import Policy
from allocator.records.gpu_info import GpuInfo

__all__ = ["with_affinity"]


def with_affinity(
    desired: Mapping[str, DesiredJob],
    policy: Policy,
    inventory: Sequence[GpuInfo] | None,
    allowed: frozenset[int],
) -> dict[str, DesiredJob]:
    """``desired`` with each running worker's ``cpus`` and ``mems`` filled in.

    ``allowed`` is the CPUs the agent may use (``os.sched_getaffinity(0)``);
    empty: pin nothing.
    """
    result = dict(desired)
    if not allowed:
        return result
    local = _local_cpus(inventory, allowed)
    nodes = {gpu.index: gpu.numa_node for gpu in inventory or () if gpu.numa_node is not None}
    cursor = 0  # where the next CPU job's CPUs start, in the sorted allowed CPUs
    ordered = sorted(allowed)
    for name, want in sorted(desired.items()):
        spec = policy.jobs.get(name)
        if want.state != "run" or spec is None or spec.cpu_affinity == "none":
            continue
        workers: list[WorkerSpec] = []
        for worker in want.workers:
            if worker.device == "cpu":
                cpus, cursor = _cpu_share(policy, name, ordered, cursor)
                workers.append(replace(worker, cpus=cpus))
            else:
                workers.append(_gpu_pinned(worker, local, nodes))
        result[name] = replace(want, workers=tuple(workers))
    return result


def _local_cpus(
    inventory: Sequence[GpuInfo] | None, allowed: frozenset[int]
) -> dict[int, frozenset[int]]:
    """GPU -> its local CPUs that the agent may use (GPUs that say none are left out)."""
    local: dict[int, frozenset[int]] = {}
    for gpu in inventory or ():
        if gpu.cpu_affinity:
            usable = parse_cpu_list(gpu.cpu_affinity) & allowed
            if usable:
                local[gpu.index] = usable
    return local


def _gpu_pinned(
    worker: WorkerSpec, local: Mapping[int, frozenset[int]], nodes: Mapping[int, int]
) -> WorkerSpec:
    if not worker.gpus or any(gpu not in local for gpu in worker.gpus):
        return worker  # a GPU that does not say: pinning to the others would starve it
    cpus = frozenset().union(*(local[gpu] for gpu in worker.gpus))
    mems = {nodes[gpu] for gpu in worker.gpus if gpu in nodes}
    complete = all(gpu in nodes for gpu in worker.gpus)
    return replace(worker, cpus=tuple(sorted(cpus)), mems=tuple(sorted(mems)) if complete else ())


def _cpu_share(
    policy: Policy, job: str, ordered: list[int], cursor: int
) -> tuple[tuple[int, ...], int]:
    """``threads`` CPUs for a CPU worker from ``cursor`` on (wrapping), and the next cursor."""
    rule = policy.fallback_for(job)
    threads = rule.threads if rule is not None and rule.action == "cpu" else None
    if not threads:
        return (), cursor
    if threads >= len(ordered):
        return tuple(ordered), cursor
    picked = [ordered[(cursor + n) % len(ordered)] for n in range(threads)]
    return tuple(sorted(picked)), (cursor + threads) % len(ordered)
