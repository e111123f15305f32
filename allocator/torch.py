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

A worker assigned a GPU never trains on CPU by accident: when CUDA does not
work, :func:`device` (and everything built on it) raises
:class:`GpuUnavailableError` naming the GPUs and the likely cause. CPU is used
only when the assignment says so (``ALLOCATOR_DEVICE=cpu``, a CPU fallback),
or when nothing was assigned at all (a script run by hand).
"""

from __future__ import annotations

import os

try:
    import torch as _torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "allocator.torch needs PyTorch, which is not installed: pip install 'gpu-allocator[torch]'"
    ) from exc

from allocator import worker
from allocator.gpus.probe import ProbeResult, run_deep_probe

__all__ = [
    "GpuUnavailableError",
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


class GpuUnavailableError(RuntimeError):
    """This worker was assigned GPUs but CUDA cannot use them; it must not run on CPU."""


def device() -> _torch.device:
    """``cuda:0`` for a worker given a GPU, ``cpu`` for one given CPU.

    Raises :class:`GpuUnavailableError` when the worker was given a GPU but
    CUDA does not work, rather than training on CPU by accident.
    """
    if worker.device_kind() == "cpu":
        return _torch.device("cpu")
    if _torch.cuda.is_available():
        return _torch.device("cuda", 0)
    if not worker.gpu_assigned():
        return _torch.device("cpu")  # nothing assigned: a script run by hand without a GPU
    raise GpuUnavailableError(_no_cuda_message())


def _no_cuda_message() -> str:
    """Which GPUs this worker was given, why CUDA cannot use them, and what to do."""
    gpus = os.environ.get("ALLOCATOR_GPUS", "").strip()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    given = f"GPU {gpus}" if gpus else "a GPU"
    return (
        f"this worker was assigned {given} (CUDA_VISIBLE_DEVICES={visible!r}) but CUDA cannot "
        f"use it: {_likely_cause()}. Refusing to fall back to CPU silently; fix that, or "
        "assign the job gpus=cpu"
    )


def _likely_cause() -> str:
    build = _torch.__version__
    if _torch.version.cuda is None and getattr(_torch.version, "hip", None) is None:
        return (
            f"this PyTorch ({build}) is a CPU-only build, compiled without CUDA; install a "
            "CUDA build of PyTorch (https://pytorch.org/get-started/locally/)"
        )
    try:
        _torch.cuda.init()  # type: ignore[no-untyped-call]
    except Exception as exc:  # whatever CUDA says is the best hint there is
        return (
            f"CUDA failed to initialise ({' '.join(str(exc).split())}); is the NVIDIA driver "
            f"loaded and new enough for CUDA {_torch.version.cuda} (check nvidia-smi)?"
        )
    return (
        "no CUDA device is visible: the listed devices are not on this machine, or the "
        "container was started without them (NVIDIA_VISIBLE_DEVICES / --gpus)"
    )


def configure() -> _torch.device:
    """Prepare this process for its device and return it.

    On CPU: ``torch.set_num_threads`` from the fallback rule's threads
    (``ALLOCATOR_THREADS``/``OMP_NUM_THREADS``), oneDNN left on. On CUDA:
    ``torch.cuda.set_device(cuda:0)``, and on a shared GPU
    ``torch.cuda.set_per_process_memory_fraction`` with the worker's share
    (``ALLOCATOR_GPU_MEMORY_FRACTION``), so its caching allocator stops at its
    slots' part of the memory instead of taking what the other jobs need.
    """
    dev = device()
    if dev.type == "cuda":
        _torch.cuda.set_device(dev)
        fraction = worker.memory_fraction()
        if fraction is not None:
            _torch.cuda.set_per_process_memory_fraction(fraction, dev)
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
