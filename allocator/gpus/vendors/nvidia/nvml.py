"""NVML access: the only module that imports ``pynvml`` (nvidia-ml-py), lazily.

Everything here talks to an *NVML library object*: the ``pynvml`` module
itself, or :class:`allocator.gpus.vendors.nvidia.fake.FakeNvml`, which implements the same
functions over a JSON file (``ALLOCATOR_NVML=fake:PATH``). Both raise an
``NVMLError`` whose ``value`` is NVML's C return code, so one code path
serves real GPUs and tests. Health signals are read by
:mod:`allocator.gpus.vendors.nvidia.signals` over the same library object.

Optional calls (NUMA node, NVLink, CPU affinity, PCIe topology, ECC, row
remapping, MIG) are guarded: a
"not supported"-kind error means "this GPU does not say" and becomes
``None``. Any other error from a device call means the device itself is in
trouble (lost, unknown error, reset required) and is reported as such.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

from allocator.errors import EXIT_UNAVAILABLE, AllocatorError
from allocator.gpus.topology import cpu_list, cpus_from_mask
from allocator.gpus.vendors.nvidia.nvml_codes import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_DEPRECATED,
    ERROR_DRIVER_NOT_LOADED,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_INVALID_ARGUMENT,
    ERROR_LIB_RM_VERSION_MISMATCH,
    ERROR_LIBRARY_NOT_FOUND,
    ERROR_NO_DATA,
    ERROR_NO_PERMISSION,
    ERROR_NOT_FOUND,
    ERROR_NOT_READY,
    ERROR_NOT_SUPPORTED,
    level_from_nvml,
)
from allocator.records.codec import replace_struct
from allocator.records.fields import PcieLevel
from allocator.records.gpu_info import GpuInfo, MigDevice

__all__ = [
    "MAX_TOPOLOGY_GPUS",
    "NvmlReading",
    "NvmlUnavailable",
    "as_text",
    "describe_error",
    "load_nvml",
    "nvml_session",
    "optional_call",
    "read_devices",
    "source_kind",
]

_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
_NVLINK_MAX_LINKS = 18
_MIB = 1024 * 1024
#: Pairwise PCIe levels are read for hosts up to this size (a call per pair of GPUs).
MAX_TOPOLOGY_GPUS = 64

# "This GPU does not say": the value is unknown, the device is fine.
_ABSENT = frozenset(
    {
        ERROR_INVALID_ARGUMENT,
        ERROR_NOT_SUPPORTED,
        ERROR_NO_PERMISSION,
        ERROR_NOT_FOUND,
        ERROR_FUNCTION_NOT_FOUND,
        ERROR_NO_DATA,
        ERROR_ARGUMENT_VERSION_MISMATCH,
        ERROR_DEPRECATED,
        ERROR_NOT_READY,
    }
)

_INIT_HINTS = {
    ERROR_LIBRARY_NOT_FOUND: "NVML library libnvidia-ml.so.1 not found (no NVIDIA driver here?)",
    ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    ERROR_NO_PERMISSION: "no permission to use NVML",
    ERROR_LIB_RM_VERSION_MISMATCH: "NVML and kernel driver versions differ (reload the driver)",
}


class NvmlUnavailable(AllocatorError):
    """NVML cannot be used here (disabled, not installed, no driver, init failed)."""

    exit_code = EXIT_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """What NVML reported about the machine's GPUs."""

    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    cuda_driver_version: int | None


def source_kind(environ: Mapping[str, str]) -> Literal["nvml", "fake"]:
    """Return which NVML ``load_nvml`` would use for ``environ``."""
    return "fake" if environ.get("ALLOCATOR_NVML", "").startswith("fake:") else "nvml"


def load_nvml(environ: Mapping[str, str]) -> Any:
    """Return the NVML library object chosen by ``ALLOCATOR_NVML``.

    Unset/``on``: the real ``pynvml``; ``off``: disabled; ``fake:PATH``: the
    JSON-file fake. Raises :class:`NvmlUnavailable` with the reason.
    """
    mode = environ.get("ALLOCATOR_NVML", "")
    if mode == "off":
        raise NvmlUnavailable("NVML disabled (ALLOCATOR_NVML=off)")
    if mode.startswith("fake:"):
        from allocator.gpus.vendors.nvidia.fake import FakeNvml

        return FakeNvml(mode.removeprefix("fake:"))
    if mode not in ("", "on"):
        raise NvmlUnavailable(f"ALLOCATOR_NVML={mode!r} is not understood (use off or fake:PATH)")
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed (pip install 'gpu-allocator[nvml]')"
        ) from exc
    return pynvml


def describe_error(exc: BaseException) -> str:
    """One line for an NVML error, with a hint for the common init failures."""
    code = getattr(exc, "value", None)
    hint = _INIT_HINTS.get(code) if isinstance(code, int) else None
    return f"{hint}: {exc}" if hint else str(exc)


@contextmanager
def nvml_session(lib: Any) -> Iterator[Any]:
    """Initialise NVML for the ``with`` block; init failures raise NvmlUnavailable."""
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        raise NvmlUnavailable(f"NVML init failed: {describe_error(exc)}") from exc
    try:
        yield lib
    finally:
        # Nothing left to release that a caller could act on.
        with suppress(lib.NVMLError):
            lib.nvmlShutdown()


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def optional_call(lib: Any, name: str, *args: Any) -> Any:
    """Call ``lib.<name>(*args)``; ``None`` where the GPU (or library) does not say."""
    fn = getattr(lib, name, None)
    if fn is None:
        return None  # an older nvidia-ml-py without this call
    try:
        return fn(*args)
    except lib.NVMLError as exc:
        if _code(exc) in _ABSENT:
            return None
        raise


def as_text(value: Any) -> str:
    """An NVML string (``bytes`` from older nvidia-ml-py releases, ``str`` from newer) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def read_devices(lib: Any) -> NvmlReading:
    """Read every GPU from an initialised NVML (see :func:`nvml_session`)."""
    driver = optional_call(lib, "nvmlSystemGetDriverVersion")
    cuda = optional_call(lib, "nvmlSystemGetCudaDriverVersion")
    gpus = [_read_gpu_or_failure(lib, index) for index in range(int(lib.nvmlDeviceGetCount()))]
    return NvmlReading(
        gpus=_with_pcie_levels(lib, _with_nvlink_peers(gpus)),
        driver_version=as_text(driver) if driver is not None else None,
        cuda_driver_version=int(cuda) if cuda is not None else None,
    )


def _read_gpu_or_failure(lib: Any, index: int) -> tuple[GpuInfo, tuple[str, ...]]:
    """A GPU and its NVLink remote bus ids; a failing GPU keeps its index and the error."""
    try:
        return _read_gpu(lib, index)
    except lib.NVMLError as exc:
        return GpuInfo(index=index, error=describe_error(exc)), ()


def _read_gpu(lib: Any, index: int) -> tuple[GpuInfo, tuple[str, ...]]:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    pci = optional_call(lib, "nvmlDeviceGetPciInfo", handle)
    name = optional_call(lib, "nvmlDeviceGetName", handle)
    memory = optional_call(lib, "nvmlDeviceGetMemoryInfo", handle)
    numa = optional_call(lib, "nvmlDeviceGetNumaNodeId", handle)
    # One 64-bit word per 64 CPUs; room for 1,024 at least, as CPU ids can be sparse.
    words = max(-(-(os.cpu_count() or 1) // 64), 16)
    mask = optional_call(lib, "nvmlDeviceGetCpuAffinity", handle, words)
    mig_enabled, migs = _read_mig(lib, handle)
    gpu = GpuInfo(
        index=index,
        uuid=as_text(lib.nvmlDeviceGetUUID(handle)),
        pci_bus_id=as_text(pci.busId) if pci is not None else None,
        name=as_text(name) if name is not None else None,
        memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
        mig_enabled=mig_enabled,
        mig_devices=migs,
        numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
        cpu_affinity=_cpu_affinity(mask),
    )
    return gpu, _nvlink_remote_bus_ids(lib, handle)


def _cpu_affinity(mask: Any) -> str | None:
    """NVML's CPU mask as a CPU list; ``None`` when NVML gave none (or an empty one)."""
    if mask is None:
        return None
    return cpu_list(cpus_from_mask([int(word) for word in mask])) or None


def _read_mig(lib: Any, handle: Any) -> tuple[bool, tuple[MigDevice, ...]]:
    mode = optional_call(lib, "nvmlDeviceGetMigMode", handle)
    if mode is None or int(mode[0]) != _MIG_ENABLE:
        return False, ()
    devices: list[MigDevice] = []
    for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
        mig = optional_call(lib, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            continue  # an empty slot: NVML numbers slots up to the maximum
        name = optional_call(lib, "nvmlDeviceGetName", mig)
        memory = optional_call(lib, "nvmlDeviceGetMemoryInfo", mig)
        devices.append(
            MigDevice(
                uuid=as_text(lib.nvmlDeviceGetUUID(mig)),
                name=as_text(name) if name is not None else "",
                memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
            )
        )
    return True, tuple(devices)


def _nvlink_remote_bus_ids(lib: Any, handle: Any) -> tuple[str, ...]:
    remotes: list[str] = []
    max_links = int(getattr(lib, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))
    for link in range(max_links):
        active = optional_call(lib, "nvmlDeviceGetNvLinkState", handle, link)
        if active is None:
            break  # no NVLink, or past the GPU's last link
        if not active:
            continue
        remote = optional_call(lib, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        if remote is not None:
            remotes.append(as_text(remote.busId).lower())
    return tuple(remotes)


def _with_nvlink_peers(read: list[tuple[GpuInfo, tuple[str, ...]]]) -> tuple[GpuInfo, ...]:
    """Turn remote PCI bus ids into peer GPU indices (links to NVSwitches are dropped)."""
    by_bus = {gpu.pci_bus_id.lower(): gpu.index for gpu, _ in read if gpu.pci_bus_id}
    result: list[GpuInfo] = []
    for gpu, remotes in read:
        peers = sorted({by_bus[bus] for bus in remotes if bus in by_bus} - {gpu.index})
        result.append(replace_struct(gpu, nvlink_peers=tuple(peers)))
    return tuple(result)


def _with_pcie_levels(lib: Any, gpus: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    """Each GPU with its PCIe level to every other GPU (one NVML call per pair)."""
    count = len(gpus)
    if count < 2 or count > MAX_TOPOLOGY_GPUS:
        return gpus
    handles = [_handle_or_none(lib, gpu) for gpu in gpus]
    levels: list[list[PcieLevel | None]] = [[None] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            level = _pcie_level(lib, handles[i], handles[j])
            levels[i][j] = levels[j][i] = level
    if not any(level for row in levels for level in row):
        return gpus  # NVML says nothing about the PCIe tree here
    return tuple(replace_struct(gpu, pcie_levels=tuple(levels[n])) for n, gpu in enumerate(gpus))


def _handle_or_none(lib: Any, gpu: GpuInfo) -> Any:
    if gpu.error:
        return None
    try:
        return lib.nvmlDeviceGetHandleByIndex(gpu.index)
    except lib.NVMLError:
        return None


def _pcie_level(lib: Any, first: Any, second: Any) -> PcieLevel | None:
    """The level between two GPUs; ``None`` when unknown (or when either GPU fails now)."""
    if first is None or second is None:
        return None
    try:
        code = optional_call(lib, "nvmlDeviceGetTopologyCommonAncestor", first, second)
    except lib.NVMLError:
        return None  # the GPU's own trouble is the health check's to report
    return level_from_nvml(code) if code is not None else None
