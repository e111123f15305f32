"""Parsing and validating the fake-NVML JSON file (see :mod:`allocator.gpus.vendors.nvidia.fake`).

Unknown fields are refused so that a typo (``"heathy": false``) is an error
naming the file and field rather than a silently healthy GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from allocator.errors import InvalidInput
from allocator.gpus.topology import parse_cpu_list
from allocator.gpus.vendors.base import VENDOR_NAMES
from allocator.records.fields import PCIE_LEVELS, PcieLevel
from allocator.records.gpu_info import MigDevice

__all__ = [
    "DEFAULT_CUDA_DRIVER_VERSION",
    "DEFAULT_DRIVER_VERSION",
    "DEFAULT_MEMORY_MIB",
    "DEFAULT_NAME",
    "FAKE_VENDORS",
    "INIT_ERRORS",
    "NVML_ERRORS",
    "FakeDevice",
    "FakeFileError",
    "FakeProcess",
    "FakeSystem",
    "default_mig_uuid",
    "default_pci_bus_id",
    "default_unique_id",
    "default_uuid",
    "parse_fake_file",
]

DEFAULT_NAME = "Fake GPU"
DEFAULT_MEMORY_MIB = 81559
DEFAULT_DRIVER_VERSION = "550.54.15"
DEFAULT_CUDA_DRIVER_VERSION = 12040
#: Values of ``init_error``: how nvmlInit fails.
INIT_ERRORS = ("driver_not_loaded", "library_not_found", "no_permission", "unknown")
#: Values of ``nvml_error``: how every call after nvmlInit fails while it is set.
NVML_ERRORS = ("unknown", "driver_not_loaded", "timeout", "uninitialized", "gpu_is_lost")

_SYSTEM_KEYS = {
    "devices",
    "driver_version",
    "cuda_driver_version",
    "init_error",
    "nvml_error",
    "vendor",
}
#: Values of ``vendor``: whose library the file stands in for (NVML by default).
FAKE_VENDORS = VENDOR_NAMES
_DEVICE_KEYS = {
    "index",
    "uuid",
    "pci_bus_id",
    "name",
    "memory_total_mib",
    "healthy",
    "lost",
    "xid_events",
    "ecc_uncorrected",
    "ecc_uncorrected_aggregate",
    "remapped_rows_uncorrectable",
    "retired_pages_double_bit",
    "remap_failure",
    "remap_pending",
    "mig_enabled",
    "mig_devices",
    "numa_node",
    "nvlink_peers",
    "cpu_affinity",
    "pcie",
    "utilization_gpu",
    "memory_used_mib",
    "processes",
    "unique_id",
}
_MIG_KEYS = {"uuid", "name", "memory_total_mib"}
_PROCESS_KEYS = {"pid", "used_memory_mib"}


class FakeFileError(InvalidInput):
    """The fake-NVML file is unreadable or malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class FakeProcess:
    """A compute process NVML lists on a fake GPU (memory ``None``: NVML cannot say)."""

    pid: int
    used_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class FakeDevice:
    """One fake GPU, with defaults filled in."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str
    memory_total_mib: int
    healthy: bool = True
    lost: bool = False
    xid_events: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_uncorrectable: int = 0
    retired_pages_double_bit: int | None = None
    remap_failure: bool = False
    remap_pending: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    numa_node: int | None = None
    nvlink_peers: tuple[int, ...] | None = None
    cpu_affinity: frozenset[int] | None = None
    #: (peer, level) pairs: the PCIe level to each GPU the file names (either side may).
    pcie: tuple[tuple[int, PcieLevel], ...] = ()

    def pcie_level(self, peer: int) -> PcieLevel | None:
        """The level this device's entry gives for ``peer``, if any."""
        return next((level for other, level in self.pcie if other == peer), None)

    utilization_gpu: int | None = 0  # percent; None: Not Supported (as on MIG GPUs)
    memory_used_mib: int = 0
    processes: tuple[FakeProcess, ...] = ()
    #: AMD: the KFD topology's ``unique_id`` (0: the GPU reports none).
    unique_id: int = 0


@dataclass(frozen=True, slots=True)
class FakeSystem:
    """The whole fake machine."""

    devices: tuple[FakeDevice, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: int = DEFAULT_CUDA_DRIVER_VERSION
    init_error: str | None = None
    nvml_error: str | None = None
    #: Whose device library the file stands in for (see :mod:`allocator.gpus.vendors.registry`).
    vendor: str = "nvidia"


def default_uuid(index: int) -> str:
    """The UUID a fake GPU gets when the file gives none (stable per index)."""
    return f"GPU-00000000-0000-4000-8000-{index:012x}"


def default_unique_id(index: int) -> int:
    """The KFD ``unique_id`` a fake AMD GPU gets when the file gives none (never 0)."""
    return 0x5E1F_0A2B_0000_0000 + index + 1


def default_pci_bus_id(index: int) -> str:
    """The PCI bus id a fake GPU gets when the file gives none (PCI order = index order)."""
    return f"00000000:{index + 1:02X}:00.0"


def default_mig_uuid(index: int, slot: int) -> str:
    """The UUID of a fake MIG device given without one."""
    return f"MIG-00000000-0000-4000-8000-{index:04x}{slot:08x}"


def parse_fake_file(raw: bytes, filename: str) -> FakeSystem:
    """Parse the file's bytes; raise :class:`FakeFileError` naming ``filename``."""
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise FakeFileError(f"fake NVML file {filename}: not UTF-8 text: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise FakeFileError(
            f"fake NVML file {filename}: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    try:
        return _system(data)
    except _Bad as exc:
        raise FakeFileError(f"fake NVML file {filename}: {exc}") from None


class _Bad(Exception):
    """A validation problem; the message says where (``devices[1].index: ...``)."""


def _mapping(value: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{where}: expected an object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise _Bad(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    return value


def _typed(data: Mapping[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    value = data.get(key, default)
    if value is None and default is None:
        return None
    # bool is an int in Python; a JSON true is never a count.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Bad(f"{where}.{key}: expected {kind.__name__}, got {json.dumps(value)}")
    if isinstance(value, int) and value < 0:
        raise _Bad(f"{where}.{key}: must not be negative, got {value}")
    return value


def _int_list(data: Mapping[str, Any], key: str, where: str) -> tuple[int, ...] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Bad(f"{where}.{key}: expected a list of integers")
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise _Bad(f"{where}.{key}: expected non-negative integers, got {json.dumps(item)}")
    return tuple(value)


def _system(data: Any) -> FakeSystem:
    top = _mapping(data, "top level", _SYSTEM_KEYS)
    raw_devices = top.get("devices", [])
    if not isinstance(raw_devices, list):
        raise _Bad("devices: expected a list")
    devices = tuple(_device(item, f"devices[{n}]") for n, item in enumerate(raw_devices))
    _check_indices(devices)
    init_error = _one_of(top, "init_error", INIT_ERRORS)
    nvml_error = _one_of(top, "nvml_error", NVML_ERRORS)
    return FakeSystem(
        devices=tuple(sorted(devices, key=lambda d: d.index)),
        driver_version=_typed(top, "driver_version", str, DEFAULT_DRIVER_VERSION, "top level"),
        cuda_driver_version=_typed(
            top, "cuda_driver_version", int, DEFAULT_CUDA_DRIVER_VERSION, "top level"
        ),
        init_error=init_error,
        nvml_error=nvml_error,
        vendor=_one_of(top, "vendor", FAKE_VENDORS) or "nvidia",
    )


def _one_of(top: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value: str | None = _typed(top, key, str, None, "top level")
    if value is not None and value not in allowed:
        raise _Bad(f"{key}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _device(item: Any, where: str) -> FakeDevice:
    data = _mapping(item, where, _DEVICE_KEYS)
    if "index" not in data:
        raise _Bad(f"{where}.index: required")
    index: int = _typed(data, "index", int, None, where)
    migs = _mig_devices(data.get("mig_devices", []), index, f"{where}.mig_devices")
    return FakeDevice(
        index=index,
        uuid=_typed(data, "uuid", str, default_uuid(index), where),
        pci_bus_id=_typed(data, "pci_bus_id", str, default_pci_bus_id(index), where),
        name=_typed(data, "name", str, DEFAULT_NAME, where),
        memory_total_mib=_typed(data, "memory_total_mib", int, DEFAULT_MEMORY_MIB, where),
        healthy=_typed(data, "healthy", bool, True, where),
        lost=_typed(data, "lost", bool, False, where),
        xid_events=_int_list(data, "xid_events", where) or (),
        ecc_uncorrected=_typed(data, "ecc_uncorrected", int, None, where),
        ecc_uncorrected_aggregate=_typed(data, "ecc_uncorrected_aggregate", int, None, where),
        remapped_rows_uncorrectable=_typed(data, "remapped_rows_uncorrectable", int, 0, where),
        retired_pages_double_bit=_typed(data, "retired_pages_double_bit", int, None, where),
        remap_failure=_typed(data, "remap_failure", bool, False, where),
        remap_pending=_typed(data, "remap_pending", bool, False, where),
        mig_enabled=_typed(data, "mig_enabled", bool, bool(migs), where),
        mig_devices=migs,
        numa_node=_typed(data, "numa_node", int, None, where),
        nvlink_peers=_int_list(data, "nvlink_peers", where),
        cpu_affinity=_cpu_affinity(data, where),
        pcie=_pcie(data.get("pcie", {}), f"{where}.pcie"),
        utilization_gpu=_percent(data, "utilization_gpu", where),
        memory_used_mib=_typed(data, "memory_used_mib", int, 0, where),
        processes=_processes(data.get("processes", []), f"{where}.processes"),
        unique_id=_unique_id(data, index, where),
    )


def _unique_id(data: Mapping[str, Any], index: int, where: str) -> int:
    value: int = _typed(data, "unique_id", int, default_unique_id(index), where)
    if value >= 1 << 64:
        raise _Bad(f"{where}.unique_id: must fit in 64 bits, got {value}")
    return value


def _cpu_affinity(data: Mapping[str, Any], where: str) -> frozenset[int] | None:
    text: str | None = _typed(data, "cpu_affinity", str, None, where)
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise _Bad(f"{where}.cpu_affinity: {exc}") from None


def _pcie(value: Any, where: str) -> tuple[tuple[int, PcieLevel], ...]:
    """``{"1": "switch"}``: the PCIe level to each named GPU."""
    if not isinstance(value, dict):
        raise _Bad(f"{where}: expected an object of GPU index -> level")
    pairs: list[tuple[int, PcieLevel]] = []
    for peer, level in value.items():
        if not peer.isascii() or not peer.isdigit():
            raise _Bad(f"{where}: {peer!r} is not a GPU index")
        if level not in PCIE_LEVELS:
            raise _Bad(f"{where}.{peer}: {level!r} is not one of {', '.join(PCIE_LEVELS)}")
        pairs.append((int(peer), cast(PcieLevel, level)))
    return tuple(sorted(pairs))


def _percent(data: Mapping[str, Any], key: str, where: str) -> int | None:
    if key in data and data[key] is None:
        return None  # the GPU does not say
    value: int = _typed(data, key, int, 0, where)
    if value > 100:
        raise _Bad(f"{where}.{key}: a percentage, at most 100, got {value}")
    return value


def _processes(value: Any, where: str) -> tuple[FakeProcess, ...]:
    if not isinstance(value, list):
        raise _Bad(f"{where}: expected a list of processes")
    result: list[FakeProcess] = []
    for n, item in enumerate(value):
        data = _mapping(item, f"{where}[{n}]", _PROCESS_KEYS)
        if "pid" not in data:
            raise _Bad(f"{where}[{n}].pid: required")
        result.append(
            FakeProcess(
                pid=_typed(data, "pid", int, None, f"{where}[{n}]"),
                used_memory_mib=_typed(data, "used_memory_mib", int, None, f"{where}[{n}]"),
            )
        )
    return tuple(result)


def _mig_devices(value: Any, index: int, where: str) -> tuple[MigDevice, ...]:
    if not isinstance(value, list):
        raise _Bad(f"{where}: expected a list of MIG UUIDs or objects")
    result: list[MigDevice] = []
    for slot, item in enumerate(value):
        if isinstance(item, str):
            result.append(MigDevice(uuid=item, name=f"MIG slot {slot}"))
            continue
        data = _mapping(item, f"{where}[{slot}]", _MIG_KEYS)
        result.append(
            MigDevice(
                uuid=_typed(data, "uuid", str, default_mig_uuid(index, slot), f"{where}[{slot}]"),
                name=_typed(data, "name", str, f"MIG slot {slot}", f"{where}[{slot}]"),
                memory_total_mib=_typed(data, "memory_total_mib", int, None, f"{where}[{slot}]"),
            )
        )
    return tuple(result)


def _check_indices(devices: tuple[FakeDevice, ...]) -> None:
    indices = sorted(d.index for d in devices)
    if indices != list(range(len(devices))):
        raise _Bad(f"devices: indices must be 0..{len(devices) - 1} once each, got {indices}")
    for device in devices:
        for peer in device.nvlink_peers or ():
            if peer >= len(devices) or peer == device.index:
                raise _Bad(f"devices[{device.index}].nvlink_peers: no other GPU {peer}")
        for peer, level in device.pcie:
            if peer >= len(devices) or peer == device.index:
                raise _Bad(f"devices[{device.index}].pcie: no other GPU {peer}")
            other = next(d for d in devices if d.index == peer).pcie_level(device.index)
            if other not in (None, level):
                raise _Bad(
                    f"devices[{device.index}].pcie: GPU {peer} is {level!r} from here but "
                    f"GPU {peer} says {other!r}"
                )
