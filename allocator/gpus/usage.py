"""GPU usage as every vendor reports it: utilization, memory in use, processes (pure).

A vendor whose library reports them (NVIDIA: NVML) gives the agent a
:class:`UsageSampler` through
:meth:`~allocator.gpus.vendors.base.DeviceVendor.usage_sampler`; the agent samples
it at its health interval. A value a GPU does not report is ``None``, never 0:
an unmeasured GPU must not look idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["GpuUsage", "ProcessOnGpu", "UsageSampler"]


@dataclass(frozen=True, slots=True)
class ProcessOnGpu:
    """One process the vendor's library lists on a GPU."""

    pid: int
    used_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's usage at one sample; ``error`` set (and nothing else) when its library failed."""

    index: int
    utilization_percent: int | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    processes: tuple[ProcessOnGpu, ...] = ()
    error: str = ""


class UsageSampler(Protocol):
    """Samples every GPU's usage, keeping the vendor's library open between samples.

    :meth:`sample` returns ``None`` while the library cannot be used (``error``
    says why): no sample is not the same as an idle GPU.
    """

    #: Why the last sample failed (``None``: it did not).
    error: str | None

    def sample(self) -> tuple[GpuUsage, ...] | None:
        """Every GPU's usage now, or ``None`` while the library fails."""
        ...

    def close(self) -> None:
        """Release the library."""
        ...
