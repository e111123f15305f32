"""What a worker on a shared GPU is told: its share of the GPU's memory and, under MPS, SMs.

Pure. In a pool with slots a job holding K of a GPU's N slots gets
``ALLOCATOR_GPU_MEMORY_FRACTION=K/N`` (which :func:`allocator.torch.configure`
hands to ``torch.cuda.set_per_process_memory_fraction``). In an MPS pool it
also connects to its GPU's MPS control daemon (``CUDA_MPS_PIPE_DIRECTORY``,
one per GPU under the agent's state directory) and is limited by MPS itself:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its share of the SMs) and
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its share of the memory, ``0=<MiB>M``:
device 0 is the one GPU the worker sees).

The daemon was started with the GPU's UUID visible, and MPS renumbers what
its server shows clients, so a client names its GPU by that UUID (or, with
no UUID known, as device 0), whatever ``visible_devices`` says.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from allocator.policy.model import Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["daemon_device", "mps_log_dir", "mps_pipe_dir", "share_env"]


def mps_pipe_dir(root: str, gpu: int) -> str:
    """Where GPU ``gpu``'s MPS control daemon and its clients meet (a short path: a socket)."""
    return os.path.join(root, f"gpu{gpu}", "pipe")


def mps_log_dir(root: str, gpu: int) -> str:
    """Where GPU ``gpu``'s MPS control daemon and server write their logs."""
    return os.path.join(root, f"gpu{gpu}", "log")


def daemon_device(gpu: int, inventory: Sequence[GpuInfo] | None) -> str:
    """What the daemon of ``gpu`` is given as ``CUDA_VISIBLE_DEVICES``: its UUID, else its index."""
    info = _info(gpu, inventory)
    return info.uuid if info is not None and info.uuid else str(gpu)


def share_env(
    sharing: Sharing,
    assignment: Assignment,
    gpus: tuple[int, ...],
    inventory: Sequence[GpuInfo] | None,
    mps_root: str | None,
) -> dict[str, str]:
    """The variables a worker seeing ``gpus`` of ``assignment`` gets for its share ({} if none).

    ``mps_root`` is the agent's MPS directory (``None``: not the agent, so no daemon to name).
    """
    if not sharing.shared or assignment.exclusive or assignment.mode != "gpu" or not gpus:
        return {}
    capacity = sharing.capacity
    if capacity is None:
        return {}  # unlimited sharing: no share is known
    held = min(assignment.slots, capacity)
    env = {"ALLOCATOR_GPU_MEMORY_FRACTION": f"{held / capacity:.6g}"}
    if sharing.mode != "mps" or mps_root is None or len(gpus) != 1:
        return env
    gpu = gpus[0]
    info = _info(gpu, inventory)
    env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir(mps_root, gpu)
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, 100 * held // capacity))
    if info is not None and info.memory_total_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={info.memory_total_mib * held // capacity}M"
    env["CUDA_VISIBLE_DEVICES"] = info.uuid if info is not None and info.uuid else "0"
    return env


def _info(gpu: int, inventory: Sequence[GpuInfo] | None) -> GpuInfo | None:
    return next((info for info in inventory or () if info.index == gpu), None)
