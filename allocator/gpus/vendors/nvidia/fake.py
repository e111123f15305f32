"""A fake NVML over a JSON file, for tests and machines without GPUs.

``ALLOCATOR_NVML=fake:PATH`` makes inventory and health use
:class:`FakeNvml` instead of ``pynvml``. It implements the subset of
pynvml's functions that :mod:`allocator.gpus.vendors.nvidia.nvml` calls, with the same
shapes and the same error codes, so the real code path is what gets tested.

File shape (every device field but ``index`` is optional)::

    {"devices": [{"index": 0, "uuid": "GPU-...", "pci_bus_id": "00000000:17:00.0",
                  "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                  "healthy": true, "lost": false, "xid_events": [79],
                  "ecc_uncorrected": 0, "ecc_uncorrected_aggregate": 0,
                  "remapped_rows_uncorrectable": 0, "retired_pages_double_bit": 0,
                  "remap_failure": false, "remap_pending": false,
                  "mig_devices": ["MIG-..."], "numa_node": 0, "nvlink_peers": [1],
                  "cpu_affinity": "0-27,56-83", "pcie": {"1": "switch", "2": "system"},
                  "utilization_gpu": 37, "memory_used_mib": 20480,
                  "processes": [{"pid": 4242, "used_memory_mib": 20000}]}],
     "driver_version": "550.54.15", "cuda_driver_version": 12040,
     "init_error": "driver_not_loaded", "nvml_error": "unknown", "vendor": "nvidia"}

``vendor`` (``nvidia`` by default) says whose library the file stands in
for: any other vendor's host has no NVML, so ``nvmlInit`` fails with
"library not found", and :mod:`allocator.gpus.vendors.registry` reads the same
devices through that vendor's fake (``amdsmi``'s, Intel's sysfs, Apple's).

The file is re-read whenever its bytes change, so editing it changes what the
next health read sees. ``lost`` makes every call on the GPU fail with "GPU is
lost"; ``healthy: false`` makes them fail with NVML's "Unknown Error".
``nvml_error`` makes every call after ``nvmlInit`` fail with that error for
as long as it is in the file: NVML itself failing, as when the driver is
being reloaded (``init_error`` does the same to ``nvmlInit``). The ECC counts
are read by ``nvmlDeviceGetTotalEccErrors`` (volatile and aggregate),
``remapped_rows_uncorrectable`` by ``nvmlDeviceGetRemappedRows``, and
``retired_pages_double_bit`` by ``nvmlDeviceGetRetiredPages`` (Not Supported
when absent, as on GPUs that remap rows instead).

``cpu_affinity`` is the CPU list ``nvmlDeviceGetCpuAffinity`` answers with (as
its bitmask). ``pcie`` gives the level ``nvmlDeviceGetTopologyCommonAncestor``
answers for a pair of GPUs (board, switch, switches, host-bridge, node,
system: NVML's INTERNAL ... SYSTEM); either GPU of the pair may name it, and a
pair named by neither is Not Supported.
``utilization_gpu`` (percent, default 0; ``null``: Not Supported, as on MIG
GPUs), ``memory_used_mib`` (default 0) and ``processes`` (the compute
processes, by PID, with the memory each uses) are what usage sampling reads
through ``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetMemoryInfo`` and
``nvmlDeviceGetComputeRunningProcesses``.

``xid_events`` is an append-only log: an event set delivers each entry once
(entries are told apart by position), including entries already in the file
when the event set registered the GPU; shortening the list delivers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from allocator.gpus.vendors.fake_file import FakeDevice, FakeFileError, FakeSystem, parse_fake_file
from allocator.gpus.vendors.nvidia.nvml_codes import (
    ERROR_DRIVER_NOT_LOADED,
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_LIBRARY_NOT_FOUND,
    ERROR_NO_PERMISSION,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNINITIALIZED,
    ERROR_UNKNOWN,
    EVENT_XID_CRITICAL,
    nvml_code,
)
from allocator.records.gpu_info import MigDevice

_AGGREGATE_ECC = 1  # NVML_AGGREGATE_ECC
_RETIRED_DOUBLE_BIT = 1  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
_PAGE_BYTES = 64 * 1024

__all__ = ["FakeHandle", "FakeNvml", "FakeNvmlError"]

_MESSAGES = {
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NO_PERMISSION: "Insufficient Permissions",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_TIMEOUT: "Timeout",
    ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    ERROR_GPU_IS_LOST: "GPU is lost",
    ERROR_UNKNOWN: "Unknown Error",
}

_NAMED_ERRORS = {
    "driver_not_loaded": ERROR_DRIVER_NOT_LOADED,
    "library_not_found": ERROR_LIBRARY_NOT_FOUND,
    "no_permission": ERROR_NO_PERMISSION,
    "unknown": ERROR_UNKNOWN,
    "timeout": ERROR_TIMEOUT,
    "uninitialized": ERROR_UNINITIALIZED,
    "gpu_is_lost": ERROR_GPU_IS_LOST,
}
_MAX_MIG_DEVICES = 7
_MIB = 1024 * 1024


class FakeNvmlError(Exception):
    """pynvml's NVMLError, faked: ``value`` is the NVML return code."""

    def __init__(self, value: int, message: str | None = None) -> None:
        """Build the error for NVML return code ``value``."""
        self.value = value
        super().__init__(message or _MESSAGES.get(value, f"NVML Error with code {value}"))


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """A device handle: a GPU index, and a MIG slot for MIG device handles."""

    index: int
    mig_slot: int | None = None


@dataclass(slots=True)
class _EventSet:
    registered: set[int] = field(default_factory=set)
    delivered: dict[int, int] = field(default_factory=dict)


class FakeNvml:
    """The pynvml functions allocator uses, answered from a JSON file."""

    NVMLError = FakeNvmlError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, path: str | Path) -> None:
        """Serve NVML answers from the JSON file at ``path`` (read lazily)."""
        self.path = Path(path)
        self._raw: bytes | None = None
        self._system: FakeSystem | None = None
        self._inits = 0

    # --- the file -------------------------------------------------------------

    def _load(self) -> FakeSystem:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise FakeNvmlError(
                ERROR_UNKNOWN, f"fake NVML file {self.path}: {exc.strerror or exc}"
            ) from exc
        if raw != self._raw or self._system is None:
            try:
                system = parse_fake_file(raw, str(self.path))
            except FakeFileError as exc:
                raise FakeNvmlError(ERROR_UNKNOWN, str(exc)) from exc
            self._raw, self._system = raw, system
        return self._system

    def _ready(self) -> FakeSystem:
        if self._inits <= 0:
            raise FakeNvmlError(ERROR_UNINITIALIZED)
        system = self._load()
        if system.nvml_error is not None:
            raise FakeNvmlError(_NAMED_ERRORS[system.nvml_error])
        return system

    def _device(self, handle: FakeHandle) -> FakeDevice:
        devices = self._ready().devices
        if handle.index >= len(devices):
            raise FakeNvmlError(ERROR_GPU_IS_LOST)  # gone from the bus since the handle
        device = devices[handle.index]
        if device.lost:
            raise FakeNvmlError(ERROR_GPU_IS_LOST)
        if not device.healthy:
            raise FakeNvmlError(ERROR_UNKNOWN)
        return device

    def _mig(self, handle: FakeHandle) -> MigDevice | None:
        """The MIG device a MIG handle names (``None`` for a whole-GPU handle)."""
        device = self._device(handle)
        if handle.mig_slot is None:
            return None
        if handle.mig_slot >= len(device.mig_devices):
            raise FakeNvmlError(ERROR_NOT_FOUND)  # the instance was destroyed
        return device.mig_devices[handle.mig_slot]

    # --- system ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Start a session; fails like NVML when the file says ``init_error``."""
        system = self._load()
        if system.vendor != "nvidia":  # another vendor's host has no NVML library at all
            raise FakeNvmlError(ERROR_LIBRARY_NOT_FOUND)
        if system.init_error is not None:
            raise FakeNvmlError(_NAMED_ERRORS[system.init_error])
        self._inits += 1

    def nvmlShutdown(self) -> None:
        """End a session."""
        if self._inits <= 0:
            raise FakeNvmlError(ERROR_UNINITIALIZED)
        self._inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver version string."""
        return self._ready().driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """The newest CUDA version the driver supports, as 1000*major + 10*minor."""
        return self._ready().cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs."""
        return len(self._ready().devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        """The handle of the GPU at NVML index ``index``."""
        if not 0 <= index < len(self._ready().devices):
            raise FakeNvmlError(ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # --- device properties ------------------------------------------------------------

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        """The NVML index of a handle."""
        self._device(handle)
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        """The GPU's (or MIG device's) UUID."""
        mig = self._mig(handle)
        return mig.uuid if mig is not None else self._device(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        """The product name."""
        mig = self._mig(handle)
        return mig.name if mig is not None else self._device(handle).name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        """PCI info; only ``busId`` is filled in."""
        return SimpleNamespace(busId=self._device(handle).pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> SimpleNamespace:
        """Memory totals in bytes, as NVML gives them."""
        mig = self._mig(handle)
        mib = mig.memory_total_mib if mig is not None else self._device(handle).memory_total_mib
        if mib is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        used = 0 if mig is not None else min(self._device(handle).memory_used_mib, mib)
        return SimpleNamespace(total=mib * _MIB, free=(mib - used) * _MIB, used=used * _MIB)

    # --- usage ---------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        """Percent of time the GPU (and its memory) was busy over the last sample period."""
        percent = self._device(handle).utilization_gpu
        if percent is None or handle.mig_slot is not None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=percent, memory=percent)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        """The compute processes on the GPU; ``usedGpuMemory`` in bytes, or None."""
        return [
            SimpleNamespace(
                pid=process.pid,
                usedGpuMemory=None
                if process.used_memory_mib is None
                else process.used_memory_mib * _MIB,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for process in self._device(handle).processes
        ]

    def nvmlDeviceGetNumaNodeId(self, handle: FakeHandle) -> int:
        """The GPU's NUMA node (Not Supported when the file gives none)."""
        node = self._device(handle).numa_node
        if node is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return node

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        """[current, pending] MIG mode."""
        mode = int(self._device(handle).mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        """How many MIG slots to probe."""
        return max(_MAX_MIG_DEVICES, len(self._device(handle).mig_devices))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, slot: int) -> FakeHandle:
        """The handle of a MIG device; Not Found for an empty slot."""
        if slot >= len(self._device(handle).mig_devices):
            raise FakeNvmlError(ERROR_NOT_FOUND)
        return FakeHandle(handle.index, slot)

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        """1 for each peer link; Invalid Argument past the last link."""
        peers = self._device(handle).nvlink_peers
        if peers is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        if link >= len(peers):
            raise FakeNvmlError(ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeHandle, link: int) -> SimpleNamespace:
        """PCI info of the GPU at the other end of ``link``."""
        peers = self._device(handle).nvlink_peers or ()
        peer = self._ready().devices[peers[link]]
        return SimpleNamespace(busId=peer.pci_bus_id)

    def nvmlDeviceGetCpuAffinity(self, handle: FakeHandle, words: int) -> list[int]:
        """The local CPUs as ``words`` 64-bit mask words (Not Supported when not given)."""
        cpus = self._device(handle).cpu_affinity
        if cpus is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        mask = [0] * words
        for cpu in cpus:
            if cpu // 64 < words:  # NVML drops what does not fit the caller's array
                mask[cpu // 64] |= 1 << (cpu % 64)
        return mask

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeHandle, second: FakeHandle) -> int:
        """NVML's level code for the pair, from whichever GPU's entry names the other."""
        one, other = self._device(first), self._device(second)
        level = one.pcie_level(other.index) or other.pcie_level(one.index)
        if level is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return nvml_code(level)

    # --- health -----------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter: int) -> int:
        """The uncorrected ECC count, volatile or aggregate (Not Supported when not given)."""
        device = self._device(handle)
        aggregate = counter == _AGGREGATE_ECC
        count = device.ecc_uncorrected_aggregate if aggregate else device.ecc_uncorrected
        if count is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return count

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        """(corrected rows, uncorrected rows, pending, failure occurred)."""
        device = self._device(handle)
        return (
            0,
            device.remapped_rows_uncorrectable,
            int(device.remap_pending),
            int(device.remap_failure),
        )

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, cause: int) -> list[int]:
        """Addresses of pages retired for ``cause`` (only double-bit ones are faked)."""
        count = self._device(handle).retired_pages_double_bit
        if count is None:
            raise FakeNvmlError(ERROR_NOT_SUPPORTED)
        return [n * _PAGE_BYTES for n in range(count)] if cause == _RETIRED_DOUBLE_BIT else []

    def nvmlEventSetCreate(self) -> _EventSet:
        """A new, empty event set."""
        self._ready()
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, types: int, events: _EventSet) -> None:
        """Register a GPU's XID critical events with an event set."""
        self._device(handle)
        if types & EVENT_XID_CRITICAL:
            events.registered.add(handle.index)

    def nvmlEventSetWait(self, events: _EventSet, timeout_ms: int) -> SimpleNamespace:
        """The next undelivered XID event; Timeout when there is none (never blocks)."""
        devices = self._ready().devices
        for index in sorted(events.registered):
            if index >= len(devices):
                continue
            log = devices[index].xid_events
            seen = min(events.delivered.get(index, 0), len(log))
            if seen < len(log):
                events.delivered[index] = seen + 1
                return SimpleNamespace(
                    device=FakeHandle(index),
                    eventType=EVENT_XID_CRITICAL,
                    eventData=log[seen],
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
            events.delivered[index] = seen
        raise FakeNvmlError(ERROR_TIMEOUT)

    def nvmlEventSetFree(self, events: _EventSet) -> None:
        """Release an event set."""
        events.registered.clear()

    def parsed(self) -> FakeSystem:
        """The file as parsed now (raises FakeNvmlError naming the file if it is bad)."""
        return self._load()
