"""Reading GPU health signals from NVML (or the fake), one read per health check.

Two kinds of failure are told apart, because they mean different things:

* NVML itself failing (``nvmlDeviceGetCount`` raises: driver reloading,
  library wedged, the fake's ``nvml_error``) says nothing about any one GPU.
  :meth:`NvmlSignalReader.read` raises :class:`NvmlUnavailable` and the
  caller keeps its last judgement instead of declaring every GPU bad.
* One device call failing while NVML answers (GPU lost, unknown error,
  reset required) is that GPU's problem: its signals carry ``failure``.

Cumulative counters are reported as read; judging them against a baseline
is :mod:`allocator.gpus.vendors.nvidia.health`'s job.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from allocator.gpus.vendors.nvidia.nvml import (
    NvmlUnavailable,
    as_text,
    describe_error,
    optional_call,
)
from allocator.gpus.vendors.nvidia.nvml_codes import EVENT_XID_CRITICAL

__all__ = ["COUNTERS", "GpuSignals", "NvmlSignalReader"]

_MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: counts since the driver loaded
_AGGREGATE_ECC = 1  # NVML_AGGREGATE_ECC: the GPU's lifetime count (kept in its InfoROM)
_RETIRED_DOUBLE_BIT = 1  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
_MAX_EVENTS_PER_READ = 1024

#: The cumulative counters a read reports, and how a reason names each. Only
#: an increase over the baseline is a problem (see :mod:`allocator.gpus.vendors.nvidia.health`).
COUNTERS: dict[str, str] = {
    "ecc_uncorrected": "uncorrected ECC errors",
    "ecc_uncorrected_aggregate": "uncorrected ECC errors (lifetime)",
    "remapped_rows_uncorrectable": "rows remapped after uncorrectable errors",
    "retired_pages_double_bit": "pages retired after double-bit ECC errors",
}


@dataclass(frozen=True, slots=True)
class GpuSignals:
    """One GPU's health signals from one read.

    ``xids`` are the XID critical events delivered since the previous read.
    The counters (see :data:`COUNTERS`) are ``None`` where the GPU does not
    report them: ``ecc_uncorrected`` is NVML's volatile count (since the
    driver loaded), ``ecc_uncorrected_aggregate`` the lifetime one,
    ``remapped_rows_uncorrectable`` and ``retired_pages_double_bit`` count
    rows and pages taken out of use after uncorrectable errors.
    ``remap_pending``/``remap_failure`` are conditions, not counters: they
    hold until the GPU is reset. ``failure`` is set when a device call failed.
    """

    index: int
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_uncorrectable: int | None = None
    retired_pages_double_bit: int | None = None
    remap_failure: bool = False
    remap_pending: bool = False
    failure: str | None = None
    uuid: str | None = None

    def counters(self) -> dict[str, int]:
        """The cumulative counters this read reported (name -> value)."""
        found = {name: getattr(self, name) for name in COUNTERS}
        return {name: int(value) for name, value in found.items() if value is not None}


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
            self._events = optional_call(lib, "nvmlEventSetCreate")
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
        self._uuids[as_text(self._lib.nvmlDeviceGetUUID(handle))] = index
        if self._events is not None:
            optional_call(
                self._lib, "nvmlDeviceRegisterEvents", handle, EVENT_XID_CRITICAL, self._events
            )
        self._handles[index] = handle
        return handle

    def read(self) -> list[GpuSignals]:
        """Return every GPU's signals now (XIDs: those delivered since the last read).

        Raises :class:`NvmlUnavailable` when NVML itself does not answer: that
        is no verdict on any GPU.
        """
        try:
            self._lib.nvmlDeviceGetCount()
        except self._lib.NVMLError as exc:
            raise NvmlUnavailable(f"NVML failed: {describe_error(exc)}") from exc
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
            return self._uuids.get(as_text(self._lib.nvmlDeviceGetUUID(device)))
        except self._lib.NVMLError:
            index = optional_call(self._lib, "nvmlDeviceGetIndex", device)
            return int(index) if index is not None else None

    def _uuid_of(self, index: int) -> str | None:
        return next((uuid for uuid, known in self._uuids.items() if known == index), None)

    def _signals(self, index: int, xids: tuple[int, ...]) -> GpuSignals:
        lib = self._lib
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._open_handle(index)
            # A plain device query first: it fails on a lost GPU even where
            # ECC and row remapping are not supported.
            lib.nvmlDeviceGetMemoryInfo(handle)
            ecc, aggregate, retired = _read_counters(lib, handle)
            remap = optional_call(lib, "nvmlDeviceGetRemappedRows", handle)
        except lib.NVMLError as exc:
            return GpuSignals(
                index=index, xids=xids, failure=describe_error(exc), uuid=self._uuid_of(index)
            )
        return GpuSignals(
            index=index,
            xids=xids,
            remapped_rows_uncorrectable=int(remap[1]) if remap is not None else None,
            remap_pending=bool(remap[2]) if remap is not None else False,
            remap_failure=bool(remap[3]) if remap is not None else False,
            uuid=self._uuid_of(index),
            ecc_uncorrected=ecc,
            ecc_uncorrected_aggregate=aggregate,
            retired_pages_double_bit=retired,
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


def _read_counters(lib: Any, handle: Any) -> tuple[int | None, int | None, int | None]:
    """Uncorrected ECC (volatile, lifetime) and double-bit retired pages (``None``: not kept).

    Retired pages are pre-Ampere; newer GPUs remap rows instead and answer
    Not Supported, which :func:`optional_call` turns into ``None``.
    """

    def ecc(counter: int) -> int | None:
        value = optional_call(
            lib, "nvmlDeviceGetTotalEccErrors", handle, _MEMORY_ERROR_UNCORRECTED, counter
        )
        return int(value) if value is not None else None

    retired = optional_call(lib, "nvmlDeviceGetRetiredPages", handle, _RETIRED_DOUBLE_BIT)
    return ecc(_VOLATILE_ECC), ecc(_AGGREGATE_ECC), len(retired) if retired is not None else None
