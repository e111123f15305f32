"""What GPUs this host has: from NVML, the fake NVML, or the policy's declaration.

NVML being absent or failing (library missing, no driver, init error, a bad
fake file) is never a crash: the inventory says "no GPUs found" with the
reason in ``error``, and the policy's declared count stands in (indices
only, ``source="declared"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from allocator.gpus.model import GpuInfo
from allocator.gpus.nvml import NvmlUnavailable, load_nvml, nvml_session, read_devices, source_kind

__all__ = ["Inventory", "InventorySource", "cuda_version_text", "read_inventory"]

InventorySource = Literal["nvml", "fake", "declared", "none"]


@dataclass(frozen=True, slots=True)
class Inventory:
    """The host's GPUs and where that knowledge came from.

    ``cuda_driver_version`` is NVML's ``nvmlSystemGetCudaDriverVersion``:
    the newest CUDA the driver supports, as ``1000*major + 10*minor``.
    ``error`` says why NVML was not used (``None`` when it was).
    """

    gpus: tuple[GpuInfo, ...]
    source: InventorySource
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    error: str | None = None

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPUs' NVML indices."""
        return tuple(gpu.index for gpu in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``allocator doctor --json`` and agent records)."""
        return {
            "source": self.source,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "cuda_driver": cuda_version_text(self.cuda_driver_version),
            "error": self.error,
            "gpus": [gpu.to_dict() for gpu in self.gpus],
        }


def cuda_version_text(version: int | None) -> str | None:
    """Render NVML's CUDA version integer (12040) as ``"12.4"``."""
    if version is None:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def read_inventory(
    declared_gpus: int | None = None, *, environ: Mapping[str, str] | None = None
) -> Inventory:
    """Read the GPUs NVML sees, or fall back to ``declared_gpus`` (the policy's count).

    ``environ`` (default ``os.environ``) is consulted for ``ALLOCATOR_NVML``
    (``off``, or ``fake:PATH``). Never raises for a missing or failing NVML.
    """
    env = os.environ if environ is None else environ
    try:
        lib = load_nvml(env)
    except NvmlUnavailable as exc:
        return declared_inventory(declared_gpus, str(exc))
    try:
        with nvml_session(lib):
            reading = read_devices(lib)
    except NvmlUnavailable as exc:
        return declared_inventory(declared_gpus, str(exc))
    except lib.NVMLError as exc:
        # A call failing after init (driver gone mid-read, fake file broken
        # mid-read): still "no GPUs found", with why.
        return declared_inventory(declared_gpus, f"NVML failed: {exc}")
    return Inventory(
        gpus=reading.gpus,
        source=source_kind(env),
        driver_version=reading.driver_version,
        cuda_driver_version=reading.cuda_driver_version,
    )


def declared_inventory(declared_gpus: int | None, reason: str) -> Inventory:
    """The inventory when NVML is unusable: the declared count, or nothing."""
    if declared_gpus is None:
        return Inventory(gpus=(), source="none", error=f"no GPUs found: {reason}")
    return Inventory(
        gpus=tuple(GpuInfo(index=i) for i in range(declared_gpus)),
        source="declared",
        error=f"no GPUs found: {reason}",
    )
