"""NVML's return, event and topology codes (nvml.h): shared by the NVML module and its fake."""

from __future__ import annotations

from allocator.records.fields import PCIE_LEVELS, PcieLevel

__all__ = [
    "ERROR_ARGUMENT_VERSION_MISMATCH",
    "ERROR_DEPRECATED",
    "ERROR_DRIVER_NOT_LOADED",
    "ERROR_FUNCTION_NOT_FOUND",
    "ERROR_GPU_IS_LOST",
    "ERROR_INVALID_ARGUMENT",
    "ERROR_LIBRARY_NOT_FOUND",
    "ERROR_LIB_RM_VERSION_MISMATCH",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_READY",
    "ERROR_NOT_SUPPORTED",
    "ERROR_NO_DATA",
    "ERROR_NO_PERMISSION",
    "ERROR_TIMEOUT",
    "ERROR_UNINITIALIZED",
    "ERROR_UNKNOWN",
    "EVENT_XID_CRITICAL",
    "level_from_nvml",
    "nvml_code",
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

#: NVML's nvmlGpuTopologyLevel_t values, in the order of :data:`PCIE_LEVELS`.
_TOPOLOGY_CODES = (0, 10, 20, 30, 40, 50)
_LEVEL_BY_CODE: dict[int, PcieLevel] = dict(zip(_TOPOLOGY_CODES, PCIE_LEVELS, strict=True))


def level_from_nvml(code: int) -> PcieLevel | None:
    """The level name of an NVML topology level (``None`` for a value NVML never returns)."""
    return _LEVEL_BY_CODE.get(int(code))


def nvml_code(level: PcieLevel) -> int:
    """NVML's value for a level name (the fake NVML answers with it)."""
    return _TOPOLOGY_CODES[PCIE_LEVELS.index(level)]
