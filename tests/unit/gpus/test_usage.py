"""Vendor-neutral usage: the sample records, and which vendors give the agent a sampler."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.gpus.usage import GpuUsage, UsageSampler
from allocator.gpus.vendors.registry import VENDORS, vendor_named
from tests.support.clock import FakeClock
from tests.support.fake_gpus import FakeGpus


def test_an_unmeasured_gpu_reads_as_unknown_never_as_idle() -> None:
    usage = GpuUsage(index=0)
    assert (usage.utilization_percent, usage.memory_used_mib, usage.processes) == (None, None, ())


def test_nvidia_gives_a_sampler_over_its_library(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 2)
    gpus.update(1, utilization_gpu=40, processes=[{"pid": 4242, "used_memory_mib": 512}])
    sampler: UsageSampler | None = vendor_named("nvidia").usage_sampler(gpus.environ, FakeClock())
    assert sampler is not None
    try:
        usage = sampler.sample()
        assert usage is not None and sampler.error is None
        assert [gpu.index for gpu in usage] == [0, 1]
        assert usage[1].utilization_percent == 40
        assert [process.pid for process in usage[1].processes] == [4242]
    finally:
        sampler.close()


def test_nvidia_s_sampler_says_why_its_library_gives_nothing(tmp_path: Path) -> None:
    sampler = vendor_named("nvidia").usage_sampler({"ALLOCATOR_NVML": "off"}, FakeClock())
    assert sampler is not None
    assert sampler.sample() is None and sampler.error


@pytest.mark.parametrize("name", ["amd", "intel", "apple"])
def test_a_vendor_whose_library_reports_no_usage_gives_no_sampler(
    name: str, tmp_path: Path
) -> None:
    gpus = FakeGpus(tmp_path / "gpus.json", 2, vendor=name)
    assert VENDORS[name].usage_sampler(gpus.environ, FakeClock()) is None
