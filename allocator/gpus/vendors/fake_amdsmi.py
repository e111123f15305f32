"""A fake ``amdsmi`` over the fake-GPU JSON file (``"vendor": "amd"``).

It answers the functions :mod:`allocator.gpus.vendors.amd` calls, with
amdsmi's names and shapes (dicts for the info structures, the BDF as
``0000:03:00.0``, the UUID without ROCr's ``GPU-`` prefix), so the real
code path is what gets tested. Handles come back in file order, which need
not be PCI order (ROCr's is not promised to be either). A device with
``lost`` or ``healthy: false`` fails every call, as a GPU gone from the bus
does; ``ecc_uncorrected`` is its uncorrectable ECC count. A file of another
vendor makes ``amdsmi_init`` fail, as on a host without the amdgpu driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.gpus.fake_file import FakeDevice, FakeFileError, FakeSystem, parse_fake_file

__all__ = ["AmdSmiException", "FakeAmdSmi"]

_STATUS_DRIVER_NOT_LOADED = 48
_STATUS_NOT_FOUND = 31


class AmdSmiException(Exception):
    """amdsmi's base exception (``AmdSmiLibraryException`` derives from it)."""

    def __init__(self, err_code: int, err_info: str = "") -> None:
        """Carry amdsmi's error code and text."""
        super().__init__(f"Error code: {err_code} {err_info}".strip())
        self.err_code = err_code
        self.err_info = err_info


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


class FakeAmdSmi:
    """The amdsmi functions allocator uses, answered from a JSON file."""

    AmdSmiException = AmdSmiException

    def __init__(self, path: str | Path) -> None:
        """Serve answers from the JSON file at ``path`` (read at ``amdsmi_init``)."""
        self.path = Path(path)
        self._system: FakeSystem | None = None

    def amdsmi_init(self, flags: Any = None) -> None:
        """Read the file; fail like amdsmi without the amdgpu driver for other vendors."""
        del flags
        try:
            system = parse_fake_file(self.path.read_bytes(), str(self.path))
        except (OSError, FakeFileError) as exc:
            raise AmdSmiException(_STATUS_DRIVER_NOT_LOADED, str(exc)) from exc
        if system.vendor != "amd" or system.init_error is not None:
            raise AmdSmiException(_STATUS_DRIVER_NOT_LOADED, "AMDSMI_STATUS_DRIVER_NOT_LOADED")
        self._system = system

    def amdsmi_shut_down(self) -> None:
        """End the session."""
        self._system = None

    def amdsmi_get_processor_handles(self) -> list[_Handle]:
        """One handle per GPU, in file order."""
        return [_Handle(n) for n in range(len(self._ready().devices))]

    def amdsmi_get_gpu_device_bdf(self, handle: _Handle) -> str:
        """The PCI address, ``domain:bus:device.function`` with a 4-digit domain."""
        return _device_unchecked(self._ready(), handle).pci_bus_id[-12:].lower()

    def amdsmi_get_gpu_device_uuid(self, handle: _Handle) -> str:
        """The GPU's UUID, without ROCr's ``GPU-`` prefix."""
        return self._device(handle).uuid.removeprefix("GPU-")

    def amdsmi_get_gpu_asic_info(self, handle: _Handle) -> dict[str, Any]:
        """The ASIC structure as amdsmi's Python binding returns it."""
        device = self._device(handle)
        return {
            "market_name": device.name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{device.index:016X}",
            "oam_id": device.index,
        }

    def amdsmi_get_gpu_vram_usage(self, handle: _Handle) -> dict[str, int]:
        """Total and used VRAM, in MB."""
        device = self._device(handle)
        return {"vram_total": device.memory_total_mib, "vram_used": device.memory_used_mib}

    def amdsmi_get_gpu_total_ecc_count(self, handle: _Handle) -> dict[str, int]:
        """ECC error counts since the driver loaded."""
        device = self._device(handle)
        return {
            "correctable_count": 0,
            "uncorrectable_count": device.ecc_uncorrected or 0,
            "deferred_count": 0,
        }

    def amdsmi_topo_get_numa_node_number(self, handle: _Handle) -> int:
        """The GPU's NUMA node."""
        device = self._device(handle)
        if device.numa_node is None:
            raise AmdSmiException(_STATUS_NOT_FOUND, "AMDSMI_STATUS_NOT_SUPPORTED")
        return device.numa_node

    def amdsmi_get_gpu_driver_info(self, handle: _Handle) -> dict[str, str]:
        """The amdgpu driver's name and version."""
        self._device(handle)
        system = self._ready()
        return {"driver_name": "amdgpu", "driver_version": system.driver_version, "driver_date": ""}

    def _ready(self) -> FakeSystem:
        if self._system is None:
            raise AmdSmiException(_STATUS_DRIVER_NOT_LOADED, "AMDSMI_STATUS_NOT_INIT")
        return self._system

    def _device(self, handle: _Handle) -> FakeDevice:
        device = _device_unchecked(self._ready(), handle)
        if device.lost or not device.healthy:
            raise AmdSmiException(_STATUS_NOT_FOUND, "AMDSMI_STATUS_NOT_FOUND")
        return device


def _device_unchecked(system: FakeSystem, handle: _Handle) -> FakeDevice:
    if handle.index >= len(system.devices):
        raise AmdSmiException(_STATUS_NOT_FOUND, "AMDSMI_STATUS_NOT_FOUND")
    return system.devices[handle.index]
