"""PyTorch helpers for workers; the only module of allocator that imports torch.

::

    from allocator.torch import autocast, configure, grad_scaler

    dev = configure()          # cuda:0 on a GPU, cpu (threads set) on fallback
    model = Model().to(dev)
    scaler = grad_scaler()     # enabled only for float16 on CUDA
    with autocast():           # float16 on CUDA, bfloat16 on CPU
        loss = model(x.to(dev)).sum()
    scaler.scale(loss).backward()

Visible devices are renumbered from 0 in the order the agent listed them,
so a worker's first GPU is always ``cuda:0``, never ``cuda:<physical id>``.
Mixed precision uses the device-generic ``torch.amp`` API only.
"""

from __future__ import annotations

import os

try:
    import torch as _torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "allocator.torch needs PyTorch, which is not installed: pip install 'allocator[torch]'"
    ) from exc

from allocator import worker
from allocator.gpus.probe import ProbeResult, run_deep_probe

__all__ = [
    "autocast",
    "autocast_dtype",
    "configure",
    "device",
    "grad_scaler",
    "health_check",
    "local_rank",
    "world_size",
]

local_rank = worker.local_rank
world_size = worker.world_size


def device() -> _torch.device:
    """``cuda:0`` when the worker was given a GPU and CUDA works, else ``cpu``."""
    if worker.device_kind() == "cuda" and _torch.cuda.is_available():
        return _torch.device("cuda", 0)
    return _torch.device("cpu")


def configure() -> _torch.device:
    """Prepare this process for its device and return it.

    On CPU: ``torch.set_num_threads`` from the fallback rule's threads
    (``ALLOCATOR_THREADS``/``OMP_NUM_THREADS``), oneDNN left on. On CUDA:
    ``torch.cuda.set_device(cuda:0)``.
    """
    dev = device()
    if dev.type == "cuda":
        _torch.cuda.set_device(dev)
        return dev
    count = worker.threads()
    if count is not None:
        _torch.set_num_threads(count)
    return dev


def autocast_dtype(dtype: _torch.dtype | None = None) -> _torch.dtype:
    """The autocast dtype: ``dtype`` if given, else float16 on CUDA, bfloat16 on CPU.

    Raises ``ValueError`` for bfloat16 on a GPU that does not support it.
    """
    dev = device()
    if dev.type == "cpu":
        return dtype if dtype is not None else _torch.bfloat16
    if dtype == _torch.bfloat16 and not _torch.cuda.is_bf16_supported():
        raise ValueError("this GPU does not support bfloat16 autocast; use torch.float16")
    return dtype if dtype is not None else _torch.float16


def autocast(dtype: _torch.dtype | None = None, *, enabled: bool = True) -> _torch.autocast:
    """``torch.amp.autocast`` for this worker's device (see :func:`autocast_dtype`)."""
    return _torch.amp.autocast(
        device_type=device().type, dtype=autocast_dtype(dtype), enabled=enabled
    )


def grad_scaler(dtype: _torch.dtype | None = None) -> _torch.amp.GradScaler:
    """A ``torch.amp.GradScaler``, enabled only for float16 autocast on CUDA.

    bfloat16 has float32's range, so it needs no loss scaling; on CPU the
    scaler is a disabled pass-through.
    """
    dev = device()
    enabled = dev.type == "cuda" and autocast_dtype(dtype) == _torch.float16
    return _torch.amp.GradScaler(dev.type, enabled=enabled)


def health_check(timeout: float = 60.0) -> ProbeResult:
    """Run the deep probe (a CUDA context in a separate process) with this worker's env."""
    return run_deep_probe(dict(os.environ), timeout)
