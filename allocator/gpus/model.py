"""Plain data describing GPUs, shared by inventory, health, records and placement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GpuInfo", "MigDevice"]


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance of a GPU."""

    uuid: str
    name: str = ""
    memory_total_mib: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as NVML (or the policy's declaration) knows it.

    ``index`` is the NVML index, which follows PCI bus order. Fields NVML
    could not provide are ``None``/empty (a declared-only GPU has just an index).
    """

    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "mig_enabled": self.mig_enabled,
            "mig_devices": [
                {"uuid": m.uuid, "name": m.name, "memory_total_mib": m.memory_total_mib}
                for m in self.mig_devices
            ],
            "numa_node": self.numa_node,
            "nvlink_peers": list(self.nvlink_peers),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        """Build from :meth:`to_dict` output (unknown fields ignored)."""
        return cls(
            index=int(data["index"]),
            uuid=data.get("uuid"),
            pci_bus_id=data.get("pci_bus_id"),
            name=data.get("name"),
            memory_total_mib=data.get("memory_total_mib"),
            mig_enabled=bool(data.get("mig_enabled", False)),
            mig_devices=tuple(
                MigDevice(
                    uuid=m["uuid"],
                    name=m.get("name", ""),
                    memory_total_mib=m.get("memory_total_mib"),
                )
                for m in data.get("mig_devices", ())
            ),
            numa_node=data.get("numa_node"),
            nvlink_peers=tuple(int(p) for p in data.get("nvlink_peers", ())),
        )
