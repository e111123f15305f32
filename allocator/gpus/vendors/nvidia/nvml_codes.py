"""NVML's return and event codes (nvml.h): shared by the NVML module and its fake."""

from __future__ import annotations

__all__ = [
    "DEFAULT_IGNORED_XIDS",
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

#: Application-caused XIDs that say nothing about the GPU's health (NVIDIA's
#: XID catalogue: 13 graphics engine exception, 31 MMU fault, 43 reset
#: channel, 45 preemptive cleanup, 68 video processor exception, 109 context
#: switch timeout).
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
