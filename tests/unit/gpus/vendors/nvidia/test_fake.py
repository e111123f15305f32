"""The fake NVML behaves like pynvml where allocator relies on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.gpus.vendors.nvidia.fake import FakeHandle, FakeNvml, FakeNvmlError
from allocator.gpus.vendors.nvidia.nvml import NvmlUnavailable, load_nvml
from allocator.gpus.vendors.nvidia.nvml_codes import (
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNINITIALIZED,
    ERROR_UNKNOWN,
    EVENT_XID_CRITICAL,
)
from tests.support.fake_gpus import FakeGpus, fake_device, write_fake_nvml


def code_of(call: object, *args: object) -> int:
    with pytest.raises(FakeNvmlError) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value.value


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", 2)


@pytest.fixture
def nvml(gpus: FakeGpus) -> FakeNvml:
    lib = FakeNvml(gpus.path)
    lib.nvmlInit()
    return lib


def test_calls_before_init_and_after_shutdown_are_uninitialized(gpus: FakeGpus) -> None:
    lib = FakeNvml(gpus.path)
    assert code_of(lib.nvmlDeviceGetCount) == ERROR_UNINITIALIZED
    lib.nvmlInit()
    assert lib.nvmlDeviceGetCount() == 2
    lib.nvmlShutdown()
    assert code_of(lib.nvmlDeviceGetCount) == ERROR_UNINITIALIZED


def test_errors_carry_nvml_codes_and_messages(gpus: FakeGpus, nvml: FakeNvml) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert code_of(nvml.nvmlDeviceGetHandleByIndex, 2) == ERROR_INVALID_ARGUMENT
    assert code_of(nvml.nvmlDeviceGetNumaNodeId, handle) == ERROR_NOT_SUPPORTED
    assert code_of(nvml.nvmlDeviceGetNvLinkState, handle, 0) == ERROR_NOT_SUPPORTED
    assert code_of(nvml.nvmlDeviceGetTotalEccErrors, handle, 1, 0) == ERROR_NOT_SUPPORTED
    gpus.update(1, lost=True)
    assert code_of(nvml.nvmlDeviceGetUUID, handle) == ERROR_GPU_IS_LOST
    assert str(FakeNvmlError(ERROR_GPU_IS_LOST)) == "GPU is lost"
    gpus.update(1, lost=None, healthy=False)
    assert code_of(nvml.nvmlDeviceGetMemoryInfo, handle) == ERROR_UNKNOWN


def test_memory_is_reported_in_bytes(gpus: FakeGpus, nvml: FakeNvml) -> None:
    gpus.update(0, memory_total_mib=1024)
    memory = nvml.nvmlDeviceGetMemoryInfo(FakeHandle(0))
    assert memory.total == 1024 * 1024 * 1024


def test_xid_log_is_delivered_once_and_shortening_delivers_nothing(
    gpus: FakeGpus, nvml: FakeNvml
) -> None:
    events = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(FakeHandle(1), EVENT_XID_CRITICAL, events)
    gpus.add_xid(1, 79)
    gpus.add_xid(0, 48)  # GPU 0 is not registered
    data = nvml.nvmlEventSetWait(events, 0)
    assert (data.device, data.eventType, data.eventData) == (FakeHandle(1), EVENT_XID_CRITICAL, 79)
    assert code_of(nvml.nvmlEventSetWait, events, 0) == ERROR_TIMEOUT
    gpus.update(1, xid_events=[])
    assert code_of(nvml.nvmlEventSetWait, events, 0) == ERROR_TIMEOUT
    gpus.add_xid(1, 74)
    assert nvml.nvmlEventSetWait(events, 0).eventData == 74


def test_load_nvml_choices(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", [fake_device(0)])
    assert isinstance(load_nvml({"ALLOCATOR_NVML": f"fake:{path}"}), FakeNvml)
    with pytest.raises(NvmlUnavailable, match="off"):
        load_nvml({"ALLOCATOR_NVML": "off"})
    with pytest.raises(NvmlUnavailable, match="not understood"):
        load_nvml({"ALLOCATOR_NVML": "yes"})


def test_nvml_error_fails_every_call_after_init_while_it_is_in_the_file(
    gpus: FakeGpus, nvml: FakeNvml
) -> None:
    gpus.system["nvml_error"] = "unknown"
    gpus.save()
    assert code_of(nvml.nvmlDeviceGetCount) == ERROR_UNKNOWN
    assert code_of(nvml.nvmlDeviceGetHandleByIndex, 0) == ERROR_UNKNOWN
    fresh = FakeNvml(gpus.path)
    fresh.nvmlInit()  # init itself works: init_error is for that
    assert code_of(fresh.nvmlSystemGetDriverVersion) == ERROR_UNKNOWN
    del gpus.system["nvml_error"]
    gpus.save()
    assert nvml.nvmlDeviceGetCount() == 2


def test_error_counters_are_read_like_nvml(gpus: FakeGpus, nvml: FakeNvml) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert code_of(nvml.nvmlDeviceGetRetiredPages, handle, 1) == ERROR_NOT_SUPPORTED
    gpus.update(
        0,
        ecc_uncorrected=2,
        ecc_uncorrected_aggregate=9,
        remapped_rows_uncorrectable=3,
        retired_pages_double_bit=2,
    )
    assert nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 0) == 2  # volatile
    assert nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 1) == 9  # aggregate
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 3, 0, 0)
    assert len(nvml.nvmlDeviceGetRetiredPages(handle, 1)) == 2  # double-bit
    assert nvml.nvmlDeviceGetRetiredPages(handle, 0) == []


def test_unknown_nvml_error_names_are_refused(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 1, nvml_error="flaky")
    with pytest.raises(FakeNvmlError, match="nvml_error: 'flaky' is not one of"):
        FakeNvml(path).nvmlInit()
