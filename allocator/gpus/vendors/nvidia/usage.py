"""GPU usage from NVML: utilization, memory in use, and the compute processes on each GPU.

:class:`NvmlUsageSampler` is NVIDIA's :class:`~allocator.gpus.usage.UsageSampler`, giving
:mod:`allocator.gpus.usage`'s records.

Read by the agent at its health interval (never on every tick): NVML calls
are cheap but not free, and none of these numbers needs sub-second freshness.
Everything goes through the same NVML library object as inventory and health
(:func:`allocator.gpus.vendors.nvidia.nvml.load_nvml`: the real ``pynvml`` or the JSON-file
fake), so tests exercise the real code path.

NVML calls used (names as in nvidia-ml-py): ``nvmlDeviceGetUtilizationRates``
(``.gpu``: percent of the last sample period a kernel ran),
``nvmlDeviceGetMemoryInfo`` (``.used``/``.total`` bytes),
``nvmlDeviceGetComputeRunningProcesses`` and, where the library has it,
``nvmlDeviceGetMPSComputeRunningProcesses`` (``.pid``, ``.usedGpuMemory``
bytes or ``None`` where NVML cannot say). A value a GPU does not report
(utilization on a MIG-enabled GPU, for one) is ``None``, never 0: an
unmeasured GPU must not look idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any

from allocator.gpus.usage import GpuUsage, ProcessOnGpu
from allocator.gpus.vendors.nvidia.nvml import (
    NvmlUnavailable,
    describe_error,
    load_nvml,
    optional_call,
)

__all__ = ["NvmlUsageSampler", "read_usage"]

_MIB = 1024 * 1024
#: After NVML failed, try again after this many seconds, doubling up to the cap.
_RETRY_FIRST_SECONDS = 5.0
_RETRY_MAX_SECONDS = 300.0


def read_usage(lib: Any) -> tuple[GpuUsage, ...]:
    """Sample every GPU of an initialised NVML; a failing GPU gives a usage with ``error``."""
    result: list[GpuUsage] = []
    for index in range(int(lib.nvmlDeviceGetCount())):
        try:
            result.append(_read_one(lib, index))
        except lib.NVMLError as exc:
            result.append(GpuUsage(index=index, error=describe_error(exc)))
    return tuple(result)


def _read_one(lib: Any, index: int) -> GpuUsage:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    rates = optional_call(lib, "nvmlDeviceGetUtilizationRates", handle)
    memory = optional_call(lib, "nvmlDeviceGetMemoryInfo", handle)
    processes: dict[int, ProcessOnGpu] = {}
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        for entry in optional_call(lib, call, handle) or ():
            process = _process(entry)
            processes.setdefault(process.pid, process)
    return GpuUsage(
        index=index,
        utilization_percent=int(rates.gpu) if rates is not None else None,
        memory_used_mib=int(memory.used) // _MIB if memory is not None else None,
        memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
        processes=tuple(sorted(processes.values(), key=lambda p: p.pid)),
    )


def _process(entry: Any) -> ProcessOnGpu:
    used = getattr(entry, "usedGpuMemory", None)
    return ProcessOnGpu(pid=int(entry.pid), used_memory_mib=int(used) // _MIB if used else None)


class NvmlUsageSampler:
    """Keeps NVML open between samples; a failure is remembered and retried with backoff.

    :meth:`sample` returns ``None`` while NVML cannot be used (``error`` says
    why): no sample is not the same as an idle GPU.
    """

    def __init__(self, environ: Mapping[str, str], clock: Callable[[], float] = time.monotonic):
        """Prepare to sample through the NVML ``environ`` selects (opened on first use)."""
        self._environ = dict(environ)
        self._clock = clock
        self._lib: Any = None
        self._retry_at = 0.0
        self._failures = 0
        self.error: str | None = None

    def sample(self) -> tuple[GpuUsage, ...] | None:
        """Every GPU's usage now, or ``None`` while NVML fails."""
        now = self._clock()
        if self._lib is None:
            if now < self._retry_at:
                return None
            self._open(now)
        lib = self._lib
        if lib is None:
            return None
        try:
            usage = read_usage(lib)
        except lib.NVMLError as exc:
            self.close()
            self._failed(f"NVML failed: {describe_error(exc)}", now)
            return None
        self.error, self._failures = None, 0
        return usage

    def _open(self, now: float) -> None:
        try:
            lib = load_nvml(self._environ)
        except NvmlUnavailable as exc:
            self._failed(str(exc), now)
            return
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            self._failed(f"NVML init failed: {describe_error(exc)}", now)
            return
        self._lib = lib

    def _failed(self, error: str, now: float) -> None:
        self.error = error
        delay = min(_RETRY_FIRST_SECONDS * 2.0 ** min(self._failures, 16), _RETRY_MAX_SECONDS)
        self._failures += 1
        self._retry_at = now + delay

    def close(self) -> None:
        """Release NVML."""
        lib, self._lib = self._lib, None
        if lib is not None:
            with suppress(lib.NVMLError):
                lib.nvmlShutdown()
