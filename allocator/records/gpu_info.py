"""The GPU description an agent publishes (:class:`GpuInfo`), with its MIG instances.

It is part of :class:`~allocator.records.types.AgentRecord`, and what the
agent, placement and the GPU layer pass around for one physical GPU; it
lives with the records so that they depend on nothing above them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from allocator.records.fields import (
    MAX_GPU_INDEX,
    Count,
    CpuList,
    DeviceUuid,
    GpuIndex,
    PcieLevel,
    Text,
)

__all__ = ["GpuInfo", "MigDevice"]


class MigDevice(msgspec.Struct, frozen=True):
    """One MIG instance of a GPU."""

    uuid: DeviceUuid
    name: Text = ""
    memory_total_mib: Count | None = None


class GpuInfo(msgspec.Struct, frozen=True):
    """One physical GPU as NVML (or the policy's declaration) knows it.

    ``index`` is the NVML index, which follows PCI bus order. Fields NVML
    could not provide are ``None``/empty (a declared-only GPU has just an
    index); ``error`` says why NVML could not read the GPU at all.
    """

    index: GpuIndex
    uuid: DeviceUuid | None = None
    pci_bus_id: Text | None = None
    name: Text | None = None
    memory_total_mib: Count | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    numa_node: Count | None = None
    nvlink_peers: tuple[GpuIndex, ...] = ()
    error: Text = ""
    #: The CPUs local to the GPU (NVML's ideal CPU affinity), as a CPU list.
    cpu_affinity: CpuList | None = None
    #: Entry ``i``: the PCIe level between this GPU and GPU ``i`` (``None``: itself, or unknown).
    pcie_levels: Annotated[
        tuple[PcieLevel | None, ...], msgspec.Meta(max_length=MAX_GPU_INDEX + 1)
    ] = ()
    #: Its DRM card number (``/dev/dri/card<N>``) and PCI device id (``0x56c0``), where the
    #: device layer reads them (Intel's sysfs): what Intel's CDI generators name a GPU by.
    drm_card: Count | None = None
    pci_device_id: Text | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInfo:
        """Build from :meth:`to_dict` output, checking every field (ValueError if wrong)."""
        try:
            return msgspec.convert(dict(data), cls)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None
