"""What GPUs this host has: from NVML, the fake NVML, or the policy's declaration.

NVML being absent or failing (library missing, no driver, init error, a bad
fake file) is never a crash: the inventory says "no GPUs found" with the
reason in ``error``, and the policy's declared count stands in (indices
only, ``source="declared"``).

A long-running reader (the agent) must not let one failed read change the
world: :func:`keep_last_good` keeps what NVML last said, GPU by GPU, so a
transient failure never swaps UUIDs for indices in a worker's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from allocator.records.codec import replace_struct
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "Inventory",
    "InventorySource",
    "cuda_version_text",
    "declared_inventory",
    "from_nvml",
    "keep_addresses",
    "keep_last_good",
]

InventorySource = Literal["nvml", "fake", "declared", "none", "amdsmi", "sysfs", "system"]
#: The sources that are a device library (or its fake) answering, not a stand-in.
_READ_SOURCES = ("nvml", "fake", "amdsmi", "sysfs", "system")


@dataclass(frozen=True, slots=True)
class Inventory:
    """The host's GPUs and where that knowledge came from.

    ``cuda_driver_version`` is NVML's ``nvmlSystemGetCudaDriverVersion``:
    the newest CUDA the driver supports, as ``1000*major + 10*minor``.
    ``error`` says why NVML was not used (``None`` when it was).
    ``vendor`` is whose devices these are (:mod:`allocator.gpus.vendors.registry`).
    """

    gpus: tuple[GpuInfo, ...]
    source: InventorySource
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    error: str | None = None
    vendor: str = "nvidia"

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPUs' NVML indices."""
        return tuple(gpu.index for gpu in self.gpus)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Inventory:
        """Rebuild from :meth:`to_dict` output; ``ValueError`` if it is not one."""
        source = data.get("source")
        if source not in (*_READ_SOURCES, "declared", "none"):
            raise ValueError(f"unknown inventory source {source!r}")
        driver, cuda = data.get("driver_version"), data.get("cuda_driver_version")
        error, vendor = data.get("error"), data.get("vendor")
        return cls(
            gpus=tuple(GpuInfo.from_dict(gpu) for gpu in data.get("gpus", ())),
            source=source,
            driver_version=driver if isinstance(driver, str) else None,
            cuda_driver_version=cuda if isinstance(cuda, int) else None,
            error=error if isinstance(error, str) else None,
            vendor=vendor if isinstance(vendor, str) else "nvidia",
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``allocator doctor --json`` and agent records)."""
        return {
            "vendor": self.vendor,
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


def from_nvml(inventory: Inventory) -> bool:
    """Whether the device library (NVML, amdsmi, sysfs, or a fake) answered the read."""
    return inventory.source in _READ_SOURCES and inventory.error is None


def keep_last_good(last_good: Inventory | None, fresh: Inventory) -> Inventory:
    """What a long-running reader should use after reading ``fresh`` (pure).

    * NVML answered: ``fresh``, except that a GPU it could not describe this
      time (a failing device: no UUID, ``error`` set) keeps its last-good
      entry, with the new error, so its device id does not change.
    * NVML failed and an earlier read succeeded: the last good inventory,
      with this read's error.
    * NVML never answered: ``fresh`` (the declared count, or nothing).
    """
    if from_nvml(fresh):
        if last_good is None:
            return fresh
        known = {gpu.index: gpu for gpu in last_good.gpus}
        return replace(fresh, gpus=tuple(_kept(gpu, known.get(gpu.index)) for gpu in fresh.gpus))
    if last_good is not None:
        return replace(last_good, error=fresh.error)
    return fresh


def keep_addresses(last_good: Inventory | None, fresh: Inventory) -> Inventory:
    """:func:`keep_last_good` for libraries that list only the GPUs present (sysfs, amdsmi).

    Such a library renumbers the GPUs left when one disappears, so each GPU
    keeps the index it had at its PCI address, and a GPU gone from the bus
    stays listed, with an error saying so (it is out of service, not
    forgotten); a GPU that appears takes the next free index.
    """
    if last_good is None or not from_nvml(fresh) or not last_good.gpus:
        return keep_last_good(last_good, fresh)
    found: dict[str | None, GpuInfo] = {gpu.pci_bus_id: gpu for gpu in fresh.gpus}
    gpus = [_at_address(last, found.get(last.pci_bus_id)) for last in last_good.gpus]
    known = {gpu.pci_bus_id for gpu in last_good.gpus}
    added = [gpu for gpu in fresh.gpus if gpu.pci_bus_id not in known]
    gpus += [replace_struct(gpu, index=len(gpus) + n) for n, gpu in enumerate(added)]
    return replace(fresh, gpus=tuple(gpus))


def _at_address(last: GpuInfo, now: GpuInfo | None) -> GpuInfo:
    if now is None:
        return replace_struct(last, error=f"gone from the bus (no GPU at {last.pci_bus_id} now)")
    return _kept(replace_struct(now, index=last.index), last)


def _kept(gpu: GpuInfo, last: GpuInfo | None) -> GpuInfo:
    if gpu.uuid is not None or not gpu.error or last is None or last.uuid is None:
        return gpu
    return replace_struct(last, error=gpu.error)


def declared_inventory(declared_gpus: int | None, reason: str) -> Inventory:
    """The inventory when NVML is unusable: the declared count, or nothing."""
    if declared_gpus is None:
        return Inventory(gpus=(), source="none", error=f"no GPUs found: {reason}")
    return Inventory(
        gpus=tuple(GpuInfo(index=i) for i in range(declared_gpus)),
        source="declared",
        error=f"no GPUs found: {reason}",
    )
