"""A fake ``amdsmi`` over the fake-GPU JSON file (``"vendor": "amd"``).

Follows AMD's amdsmi: ``py-interface/amdsmi_interface.py`` (the shapes the
Python binding returns), ``py-interface/amdsmi_exception.py``
(``AmdSmiLibraryException`` and ``get_error_code()``),
``include/amd_smi/amdsmi.h`` (the ``amdsmi_status_t`` codes) and
``src/amd_smi/amd_smi.cc`` / ``amd_smi_uuid.cc`` (where each value comes
from), so the real reader is what gets tested:

* ``asic_serial`` is the KFD ``unique_id`` (the file's ``unique_id``), which
  amdsmi reads from the card's ``device/unique_id`` and the binding prints
  as ``0x`` + 16 upper-case hex digits (``N/A`` when there is none);
* ``amdsmi_get_gpu_device_uuid`` is ``amdsmi_uuid_gen``'s 36-character
  string built from that serial and the PCI device id: not what ROCr takes;
* ``amdsmi_get_gpu_total_ecc_count`` raises NOT_SUPPORTED where the real one
  does (no DRM, as on many VM guests): here when ``ecc_uncorrected`` is
  absent; otherwise it is the uncorrectable count;
* a device with ``lost`` or ``healthy: false`` fails every call with
  NOT_FOUND, as a GPU gone from the bus does; a file of another vendor makes
  ``amdsmi_init`` fail with DRIVER_NOT_LOADED, as on a host without amdgpu.

Handles come back in file order, which need not be PCI order. The file's
``uuid`` field is not read: amdsmi derives its UUID, as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from allocator.gpus.vendors.fake_file import FakeDevice, FakeFileError, FakeSystem, parse_fake_file

__all__ = [
    "AmdSmiException",
    "AmdSmiLibraryException",
    "AmdSmiRetCode",
    "FakeAmdSmi",
    "amdsmi_uuid",
]

_DEVICE_ID = 0x74A1  # MI300X's PCI device id, as amdsmi_get_gpu_asic_info gives it


class AmdSmiRetCode(IntEnum):
    """``amdsmi_status_t`` values (``include/amd_smi/amdsmi.h``) the fake returns."""

    SUCCESS = 0
    ERR_INVAL = 1
    ERR_NOT_SUPPORTED = 2
    ERR_NOT_FOUND = 31
    NOT_INIT = 32
    DRIVER_NOT_LOADED = 34


_INFO: dict[int, str] = {
    AmdSmiRetCode.ERR_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    AmdSmiRetCode.ERR_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AmdSmiRetCode.ERR_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    AmdSmiRetCode.NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    AmdSmiRetCode.DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}


class AmdSmiException(Exception):
    """amdsmi's base exception."""


class AmdSmiLibraryException(AmdSmiException):
    """A call's status other than success, as amdsmi's ``_check_res`` raises it."""

    def __init__(self, err_code: int) -> None:
        """Keep the code (amdsmi keeps its absolute value) and its text."""
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        unknown = "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"
        self.err_info = _INFO.get(err_code, unknown)

    def __str__(self) -> str:
        """amdsmi's wording."""
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        """The ``amdsmi_status_t`` value."""
        return self.err_code

    def get_error_info(self) -> str:
        """The status's name and meaning."""
        return self.err_info


def amdsmi_uuid(serial: int, device_id: int) -> str:
    """``amdsmi_uuid_gen(str, serial, did, 0xff)`` of ``amd_smi_uuid.cc``, as text.

    The serial's bytes land in the bit fields of a version-1 UUID: byte 7 at
    the top of ``time_low`` (over the device id and function 0xff), byte 6 in
    the clock-sequence byte, bytes 4-5 and 0-3 in the node field.
    """
    time_low = ((serial >> 56) & 0xFF) << 24 | 0xFF << 16 | device_id & 0xFFFF
    clock = 2 << 14 | ((serial >> 48) & 0xFF)  # variant 2, clk_seq_hi 0, then asic_6
    node = (serial >> 32) & 0xFFFF, serial & 0xFFFFFFFF
    return f"{time_low:08x}-0000-1000-{clock:04x}-{node[0]:04x}{node[1]:08x}"


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


class FakeAmdSmi:
    """The amdsmi functions allocator uses, answered from a JSON file."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetCode = AmdSmiRetCode

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
            raise AmdSmiLibraryException(AmdSmiRetCode.DRIVER_NOT_LOADED) from exc
        if system.vendor != "amd" or system.init_error is not None:
            raise AmdSmiLibraryException(AmdSmiRetCode.DRIVER_NOT_LOADED)
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
        """amdsmi's 36-character UUID, derived from the serial and device id."""
        return amdsmi_uuid(self._device(handle).unique_id, _DEVICE_ID)

    def amdsmi_get_gpu_asic_info(self, handle: _Handle) -> dict[str, Any]:
        """The ASIC structure as amdsmi's Python binding returns it."""
        device = self._device(handle)
        # The binding's format of the card's unique_id text; N/A where the card has none.
        serial = f"0x{device.unique_id:016X}" if device.unique_id else "N/A"
        return {
            "market_name": device.name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": hex(_DEVICE_ID),
            "rev_id": "0x00",
            "asic_serial": serial,
            "oam_id": device.index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_vram_usage(self, handle: _Handle) -> dict[str, int]:
        """Total and used VRAM, in MB."""
        device = self._device(handle)
        return {"vram_total": device.memory_total_mib, "vram_used": device.memory_used_mib}

    def amdsmi_get_gpu_total_ecc_count(self, handle: _Handle) -> dict[str, int]:
        """ECC error counts since the driver loaded; NOT_SUPPORTED without DRM."""
        device = self._device(handle)
        if device.ecc_uncorrected is None:
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
        return {
            "correctable_count": 0,
            "uncorrectable_count": device.ecc_uncorrected,
            "deferred_count": 0,
        }

    def amdsmi_topo_get_numa_node_number(self, handle: _Handle) -> int:
        """The GPU's NUMA node."""
        device = self._device(handle)
        if device.numa_node is None:
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
        return device.numa_node

    def amdsmi_get_gpu_driver_info(self, handle: _Handle) -> dict[str, str]:
        """The amdgpu driver's name and version."""
        self._device(handle)
        system = self._ready()
        return {"driver_name": "amdgpu", "driver_version": system.driver_version, "driver_date": ""}

    def _ready(self) -> FakeSystem:
        if self._system is None:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)
        return self._system

    def _device(self, handle: _Handle) -> FakeDevice:
        device = _device_unchecked(self._ready(), handle)
        if device.lost or not device.healthy:
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_FOUND)
        return device


def _device_unchecked(system: FakeSystem, handle: _Handle) -> FakeDevice:
    if handle.index >= len(system.devices):
        raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_FOUND)
    return system.devices[handle.index]
