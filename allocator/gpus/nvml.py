"""NVML access: the only module that imports ``pynvml`` (nvidia-ml-py), lazily.

Everything here talks to an *NVML library object*: the ``pynvml`` module
itself, or :class:`allocator.gpus.fake.FakeNvml`, which implements the same
functions over a JSON file (``ALLOCATOR_NVML=fake:PATH``). Both raise an
``NVMLError`` whose ``value`` is NVML's C return code, so one code path
serves real GPUs and tests.

Optional calls (NUMA node, NVLink, ECC, row remapping, MIG) are guarded: a
"not supported"-kind error means "this GPU does not say" and becomes
``None``. Any other error from a device call means the device itself is in
trouble (lost, unknown error, reset required) and is reported as such.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

from allocator.errors import EXIT_UNAVAILABLE, AllocatorError
from allocator.gpus.model import GpuInfo, MigDevice
from allocator.records import replace_struct

__all__ = [
    "ERROR_GPU_IS_LOST",
    "ERROR_UNKNOWN",
    "EVENT_XID_CRITICAL",
    "GpuSignals",
    "NvmlReading",
    "NvmlSignalReader",
    "NvmlUnavailable",
    "describe_error",
    "load_nvml",
    "nvml_session",
    "read_devices",
    "source_kind",
]

# NVML return codes (nvml.h). They are the C API's values, shared by pynvml
# and the fake, so errors are classified by code rather than by class.
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_NO_DATA = 21
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_DEPRECATED = 26
ERROR_NOT_READY = 27
ERROR_UNKNOWN = 999

#: nvmlEventTypeXidCriticalError
EVENT_XID_CRITICAL = 0x8
_MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: counts since the driver loaded
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
_NVLINK_MAX_LINKS = 18
_MIB = 1024 * 1024
_MAX_EVENTS_PER_READ = 1024

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


@dataclass(frozen=True, slots=True)
class GpuSignals:
    """One GPU's health signals from one read.

    ``xids`` are the XID critical events delivered since the previous read;
    ``ecc_uncorrected`` is NVML's volatile (since driver load) uncorrected
    ECC count, ``None`` where the GPU does not report it; ``failure`` is set
    when a device call failed (GPU lost, unknown error, reset required).
    """

    index: int
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    remap_failure: bool = False
    remap_pending: bool = False
    failure: str | None = None


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
        from allocator.gpus.fake import FakeNvml

        return FakeNvml(mode.removeprefix("fake:"))
    if mode not in ("", "on"):
        raise NvmlUnavailable(f"ALLOCATOR_NVML={mode!r} is not understood (use off or fake:PATH)")
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            "nvidia-ml-py is not installed (pip install 'allocator[nvml]')"
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


def _optional(lib: Any, name: str, *args: Any) -> Any:
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_devices(lib: Any) -> NvmlReading:
    """Read every GPU from an initialised NVML (see :func:`nvml_session`)."""
    driver = _optional(lib, "nvmlSystemGetDriverVersion")
    cuda = _optional(lib, "nvmlSystemGetCudaDriverVersion")
    gpus = [_read_gpu_or_failure(lib, index) for index in range(int(lib.nvmlDeviceGetCount()))]
    return NvmlReading(
        gpus=_with_nvlink_peers(gpus),
        driver_version=_text(driver) if driver is not None else None,
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
    pci = _optional(lib, "nvmlDeviceGetPciInfo", handle)
    name = _optional(lib, "nvmlDeviceGetName", handle)
    memory = _optional(lib, "nvmlDeviceGetMemoryInfo", handle)
    numa = _optional(lib, "nvmlDeviceGetNumaNodeId", handle)
    mig_enabled, migs = _read_mig(lib, handle)
    gpu = GpuInfo(
        index=index,
        uuid=_text(lib.nvmlDeviceGetUUID(handle)),
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        name=_text(name) if name is not None else None,
        memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
        mig_enabled=mig_enabled,
        mig_devices=migs,
        numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
    )
    return gpu, _nvlink_remote_bus_ids(lib, handle)


def _read_mig(lib: Any, handle: Any) -> tuple[bool, tuple[MigDevice, ...]]:
    mode = _optional(lib, "nvmlDeviceGetMigMode", handle)
    if mode is None or int(mode[0]) != _MIG_ENABLE:
        return False, ()
    devices: list[MigDevice] = []
    for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
        mig = _optional(lib, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            continue  # an empty slot: NVML numbers slots up to the maximum
        name = _optional(lib, "nvmlDeviceGetName", mig)
        memory = _optional(lib, "nvmlDeviceGetMemoryInfo", mig)
        devices.append(
            MigDevice(
                uuid=_text(lib.nvmlDeviceGetUUID(mig)),
                name=_text(name) if name is not None else "",
                memory_total_mib=int(memory.total) // _MIB if memory is not None else None,
            )
        )
    return True, tuple(devices)


def _nvlink_remote_bus_ids(lib: Any, handle: Any) -> tuple[str, ...]:
    remotes: list[str] = []
    max_links = int(getattr(lib, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))
    for link in range(max_links):
        active = _optional(lib, "nvmlDeviceGetNvLinkState", handle, link)
        if active is None:
            break  # no NVLink, or past the GPU's last link
        if not active:
            continue
        remote = _optional(lib, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        if remote is not None:
            remotes.append(_text(remote.busId).lower())
    return tuple(remotes)


def _with_nvlink_peers(read: list[tuple[GpuInfo, tuple[str, ...]]]) -> tuple[GpuInfo, ...]:
    """Turn remote PCI bus ids into peer GPU indices (links to NVSwitches are dropped)."""
    by_bus = {gpu.pci_bus_id.lower(): gpu.index for gpu, _ in read if gpu.pci_bus_id}
    result: list[GpuInfo] = []
    for gpu, remotes in read:
        peers = sorted({by_bus[bus] for bus in remotes if bus in by_bus} - {gpu.index})
        result.append(replace_struct(gpu, nvlink_peers=tuple(peers)))
    return tuple(result)


class NvmlSignalReader:
    """Reads health signals on every :meth:`read`; keeps NVML open in between.

    XID critical events come from an NVML event set registered once per GPU
    (``nvmlDeviceRegisterEvents``) and drained with ``nvmlEventSetWait``
    timeout 0 on every read, so a read never blocks.
    """

    def __init__(self, lib: Any) -> None:
        """Initialise NVML, take a handle per GPU, and register for XID events."""
        self._lib = lib
        self._closed = True
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise NvmlUnavailable(f"NVML init failed: {describe_error(exc)}") from exc
        self._closed = False
        self._events: Any = None
        self._handles: dict[int, Any] = {}
        self._uuids: dict[str, int] = {}
        try:
            self._count = int(lib.nvmlDeviceGetCount())
            self._events = _optional(lib, "nvmlEventSetCreate")
        except lib.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML failed: {describe_error(exc)}") from exc
        for index in range(self._count):
            # A GPU failing here is reported by every read until it answers.
            with suppress(lib.NVMLError):
                self._open_handle(index)

    @property
    def indices(self) -> tuple[int, ...]:
        """The NVML indices this reader watches."""
        return tuple(range(self._count))

    def _open_handle(self, index: int) -> Any:
        handle = self._lib.nvmlDeviceGetHandleByIndex(index)
        self._uuids[_text(self._lib.nvmlDeviceGetUUID(handle))] = index
        if self._events is not None:
            _optional(
                self._lib, "nvmlDeviceRegisterEvents", handle, EVENT_XID_CRITICAL, self._events
            )
        self._handles[index] = handle
        return handle

    def read(self) -> list[GpuSignals]:
        """Return every GPU's signals now (XIDs: those delivered since the last read)."""
        xids = self._drain_xids()
        return [self._signals(index, tuple(xids.get(index, ()))) for index in self.indices]

    def _drain_xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                data = self._lib.nvmlEventSetWait(self._events, 0)
            except self._lib.NVMLError:
                break  # ERROR_TIMEOUT: nothing pending (other errors: try next read)
            if int(data.eventType) & EVENT_XID_CRITICAL:
                index = self._index_of(data.device)
                if index is not None:
                    found.setdefault(index, []).append(int(data.eventData))
        return found

    def _index_of(self, device: Any) -> int | None:
        try:
            return self._uuids.get(_text(self._lib.nvmlDeviceGetUUID(device)))
        except self._lib.NVMLError:
            index = _optional(self._lib, "nvmlDeviceGetIndex", device)
            return int(index) if index is not None else None

    def _signals(self, index: int, xids: tuple[int, ...]) -> GpuSignals:
        lib = self._lib
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._open_handle(index)
            # A plain device query first: it fails on a lost GPU even where
            # ECC and row remapping are not supported.
            lib.nvmlDeviceGetMemoryInfo(handle)
            ecc = _optional(
                lib,
                "nvmlDeviceGetTotalEccErrors",
                handle,
                _MEMORY_ERROR_UNCORRECTED,
                _VOLATILE_ECC,
            )
            remap = _optional(lib, "nvmlDeviceGetRemappedRows", handle)
        except lib.NVMLError as exc:
            return GpuSignals(index=index, xids=xids, failure=describe_error(exc))
        return GpuSignals(
            index=index,
            xids=xids,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            remap_pending=bool(remap[2]) if remap is not None else False,
            remap_failure=bool(remap[3]) if remap is not None else False,
        )

    def close(self) -> None:
        """Free the event set and shut NVML down (once)."""
        lib = self._lib
        if self._closed:
            return
        self._closed = True
        # Shutting down: nothing a caller could do about an error here.
        if self._events is not None:
            with suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._events)
        with suppress(lib.NVMLError):
            lib.nvmlShutdown()
        self._events = None
