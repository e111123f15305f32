"""PyTorch helpers for workers; the only module of allocator that imports torch.

::

    from allocator.torch import autocast, configure, grad_scaler

    dev = configure()          # cuda:0 / xpu:0 / mps on a GPU, cpu (threads set) on fallback
    model = Model().to(dev)
    scaler = grad_scaler()     # enabled only for float16 on a GPU
    with autocast():           # float16 on CUDA/ROCm and MPS, bfloat16 on XPU and CPU
        loss = model(x.to(dev)).sum()
    scaler.scale(loss).backward()

The device type is the one the agent assigned (``ALLOCATOR_DEVICE``, from the
host's vendor): ``cuda`` on NVIDIA and on AMD (PyTorch's ROCm build drives
HIP devices as ``cuda``), ``xpu`` on Intel, ``mps`` on Apple silicon, ``cpu``
on a CPU fallback. Visible devices are renumbered from 0, so a worker's first
GPU is always ``cuda:0`` (``xpu:0``), never ``cuda:<physical id>``: in the
order the agent listed them under CUDA and ROCm, in PCI order under Level Zero
(whose mask does not reorder; the agent lists Intel GPUs in that order, so
``ALLOCATOR_GPUS`` names ``xpu:0`` first either way). Mixed precision uses the device-generic
``torch.amp`` API only.

A worker assigned a GPU never trains on CPU by accident: when its device type
does not work, :func:`device` (and everything built on it) raises
:class:`GpuUnavailableError` naming the GPUs and the likely cause. CPU is used
only when the assignment says so (``ALLOCATOR_DEVICE=cpu``, a CPU fallback),
or when nothing was assigned at all (a script run by hand, which gets the
first of cuda, xpu, mps that works, else cpu).
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
from allocator.gpus.probe import ProbeResult, default_probe_command, run_deep_probe
from allocator.gpus.vendors.base import NotSupported
from allocator.gpus.vendors.registry import AmpFeature, DeviceVendor, amp_problem, vendor_named

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
    """This worker's device: ``cuda:0``, ``xpu:0``, ``mps`` or ``cpu``, as assigned.

    Raises :class:`GpuUnavailableError` when the worker was given a GPU but
    its device type does not work, rather than training on CPU by accident.
    """
    kind = worker.device_kind()
    if kind == "cpu":
        return _torch.device("cpu")
    if not worker.gpu_assigned():  # a script run by hand: wherever it can
        return next((_first(k) for k in ("cuda", "xpu", "mps") if _works(k)), _torch.device("cpu"))
    if _works(kind):
        return _first(kind)
    if kind == "cuda":
        raise GpuUnavailableError(_no_cuda_message())
    raise GpuUnavailableError(_not_working_message(kind))


def _works(kind: str) -> bool:
    """Whether PyTorch can use devices of type ``kind`` here."""
    if kind == "cuda":
        return bool(_torch.cuda.is_available())
    if kind == "xpu":
        return hasattr(_torch, "xpu") and bool(_torch.xpu.is_available())
    return bool(_torch.backends.mps.is_available())


def _first(kind: str) -> _torch.device:
    return _torch.device("mps") if kind == "mps" else _torch.device(kind, 0)


def _not_working_message(kind: str) -> str:
    """Which GPUs this xpu or mps worker was given, and why PyTorch cannot use them."""
    gpus = os.environ.get("ALLOCATOR_GPUS", "").strip()
    given = f"GPU {gpus}" if gpus else "a GPU"
    if kind == "xpu":
        mask = os.environ.get("ZE_AFFINITY_MASK", "")
        built = hasattr(_torch, "xpu") and _torch.xpu._is_compiled()
        cause = (
            "no Intel GPU is visible to Level Zero (is the driver loaded, and the device in "
            "this container?)"
            if built
            else f"this PyTorch ({_torch.__version__}) was built without XPU support; install "
            "PyTorch's XPU build"
        )
        where = f"an Intel {given} (ZE_AFFINITY_MASK={mask!r})"
    else:
        cause = (
            "the MPS backend is unavailable (macOS 12.3 or newer on Apple silicon, and a "
            "PyTorch built with MPS, are needed)"
        )
        where = f"the Apple {given}"
    return (
        f"this worker was assigned {where} but torch.{kind} cannot use it: {cause}. Refusing "
        "to fall back to CPU silently; fix that, or assign the job gpus=cpu"
    )


def _no_cuda_message() -> str:
    """Which GPUs this worker was given, why CUDA cannot use them, and what to do."""
    gpus = os.environ.get("ALLOCATOR_GPUS", "").strip()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    given = f"GPU {gpus}" if gpus else "a GPU"
    vendor = _worker_vendor()
    # "cuda" devices without a CUDA driver: PyTorch's ROCm build drives them.
    if vendor.torch_device_type == "cuda" and isinstance(vendor.cuda_driver_source, NotSupported):
        mask = vendor.visibility_variables[0]
        given = f"{vendor.display_name} {given} ({mask}={os.environ.get(mask, '')!r})"
        return (
            f"this worker was assigned {given} but PyTorch's ROCm (cuda) device cannot use "
            f"it: {_likely_rocm_cause()}. Refusing to fall back to CPU silently; fix that, or "
            "assign the job gpus=cpu"
        )
    return (
        f"this worker was assigned {given} (CUDA_VISIBLE_DEVICES={visible!r}) but CUDA cannot "
        f"use it: {_likely_cause()}. Refusing to fall back to CPU silently; fix that, or "
        "assign the job gpus=cpu"
    )


def _worker_vendor() -> DeviceVendor:
    """The vendor whose GPUs this worker was given; NVIDIA's when the agent did not
    say, or named one this version does not know."""
    try:
        return vendor_named(worker.vendor())
    except ValueError:
        return vendor_named(None)


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


def _likely_rocm_cause() -> str:
    hip = getattr(_torch.version, "hip", None)
    if hip is None:
        kind = f"a CUDA build (CUDA {_torch.version.cuda})" if _torch.version.cuda else "CPU-only"
        return (
            f"this PyTorch ({_torch.__version__}) is {kind}, not a ROCm build; install PyTorch's "
            "ROCm build (https://pytorch.org/get-started/locally/)"
        )
    return (
        f"no ROCm device is visible (is the amdgpu driver loaded, /dev/kfd reachable, and the "
        f"GPU supported by HIP {hip}?)"
    )


def configure() -> _torch.device:
    """Prepare this process for its device and return it.

    On CPU: oneDNN on (``torch.backends.mkldnn``: PyTorch's fast CPU kernels)
    and ``torch.set_num_threads`` from the fallback rule's threads
    (``ALLOCATOR_THREADS``/``OMP_NUM_THREADS``), else the CPUs this process
    may run on. On CUDA (NVIDIA or ROCm): ``torch.cuda.set_device(cuda:0)``,
    and on a shared GPU ``torch.cuda.set_per_process_memory_fraction`` with the
    worker's share (``ALLOCATOR_GPU_MEMORY_FRACTION``), so its caching
    allocator stops at its slots' part of the memory. On XPU:
    ``torch.xpu.set_device(xpu:0)``. On MPS there is nothing to set.
    """
    dev = device()
    if dev.type == "cuda":
        _torch.cuda.set_device(dev)
        fraction = worker.memory_fraction()
        if fraction is not None:
            _torch.cuda.set_per_process_memory_fraction(fraction, dev)
        return dev
    if dev.type == "xpu":
        _torch.xpu.set_device(dev)
        return dev
    if dev.type == "cpu":
        # A module-level property: plain assignment is what sets it (typed as the descriptor).
        setattr(_torch.backends.mkldnn, "enabled", True)  # noqa: B010
        _torch.set_num_threads(worker.threads() or _usable_cpus())
    return dev


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, e.g. the agent's pinning)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def autocast_dtype(dtype: _torch.dtype | None = None) -> _torch.dtype:
    """The autocast dtype: ``dtype`` if given, else float16 on CUDA/ROCm and MPS, bfloat16
    on XPU (Intel GPUs run it natively) and CPU.

    Raises ``ValueError`` for bfloat16 on a CUDA GPU that does not support it.
    """
    dev = device()
    if dev.type in ("cpu", "xpu"):
        return dtype if dtype is not None else _torch.bfloat16
    if dev.type == "cuda" and dtype == _torch.bfloat16 and not _torch.cuda.is_bf16_supported():
        raise ValueError("this GPU does not support bfloat16 autocast; use torch.float16")
    return dtype if dtype is not None else _torch.float16


def autocast(dtype: _torch.dtype | None = None, *, enabled: bool = True) -> _torch.autocast:
    """``torch.amp.autocast`` for this worker's device (see :func:`autocast_dtype`).

    Raises ``RuntimeError`` on ``mps`` under a PyTorch older than 2.5, whose
    autocast does not know the device type.
    """
    dev = device()
    _check_amp(dev, "autocast")
    return _torch.amp.autocast(device_type=dev.type, dtype=autocast_dtype(dtype), enabled=enabled)


def grad_scaler(dtype: _torch.dtype | None = None) -> _torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` for this worker's device, enabled only for float16 on a GPU.

    bfloat16 has float32's range, so it needs no loss scaling; on CPU the
    scaler is a disabled pass-through. Raises ``RuntimeError`` for an enabled
    scaler on ``mps`` under a PyTorch older than 2.8, whose ``step()`` fails there.
    """
    dev = device()
    enabled = dev.type != "cpu" and autocast_dtype(dtype) == _torch.float16
    if enabled:
        _check_amp(dev, "grad_scaler")
    return _torch.amp.GradScaler(dev.type, enabled=enabled)


def _check_amp(dev: _torch.device, feature: AmpFeature) -> None:
    """Refuse now, with the version needed, what this PyTorch would fail at mid-training
    (MPS before 2.5 or 2.8: the vendors of ``dev``'s type say)."""
    problem = amp_problem(dev.type, feature, str(_torch.__version__))
    if problem is not None:
        raise RuntimeError(problem)


def health_check(timeout: float = 60.0) -> ProbeResult:
    """Run the deep probe with this worker's env: a tensor on its device type (``cuda``,
    also on ROCm; ``xpu``; ``mps``) in a separate process, killed after ``timeout`` s."""
    command = default_probe_command(worker.device_kind())
    return run_deep_probe(dict(os.environ), timeout, command)
