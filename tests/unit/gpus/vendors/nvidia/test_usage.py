"""GPU usage through the fake NVML: utilization, memory, compute processes, NVML failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.gpus.usage import GpuUsage, ProcessOnGpu
from allocator.gpus.vendors.fake_file import FakeFileError, parse_fake_file
from allocator.gpus.vendors.nvidia.usage import NvmlUsageSampler
from tests.support.clock import FakeClock
from tests.support.fake_gpus import FakeGpus


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", 2)


def test_a_sample_reads_utilization_memory_and_processes_of_every_gpu(gpus: FakeGpus) -> None:
    gpus.update(
        0,
        utilization_gpu=37,
        memory_used_mib=20480,
        memory_total_mib=81920,
        processes=[{"pid": 4242, "used_memory_mib": 20000}, {"pid": 17}],
    )
    sampler = NvmlUsageSampler(gpus.environ, FakeClock())
    assert sampler.sample() == (
        GpuUsage(
            index=0,
            utilization_percent=37,
            memory_used_mib=20480,
            memory_total_mib=81920,
            processes=(ProcessOnGpu(17, None), ProcessOnGpu(4242, 20000)),
        ),
        GpuUsage(index=1, utilization_percent=0, memory_used_mib=0, memory_total_mib=81559),
    )


def test_a_gpu_that_cannot_measure_utilization_is_unknown_not_idle(gpus: FakeGpus) -> None:
    gpus.devices[1]["utilization_gpu"] = None  # update(None) would drop the field
    gpus.save()
    usage = NvmlUsageSampler(gpus.environ, FakeClock()).sample()
    assert usage is not None and usage[1].utilization_percent is None


def test_a_failing_gpu_gives_an_error_and_no_numbers(gpus: FakeGpus) -> None:
    gpus.update(1, lost=True)
    usage = NvmlUsageSampler(gpus.environ, FakeClock()).sample()
    assert usage is not None
    assert usage[1].error == "GPU is lost" and usage[1].utilization_percent is None


def test_nvml_failing_gives_no_sample_and_is_retried_with_backoff(gpus: FakeGpus) -> None:
    clock = FakeClock()
    sampler = NvmlUsageSampler(gpus.environ, clock)
    assert sampler.sample() is not None
    gpus.system["nvml_error"] = "driver_not_loaded"
    gpus.save()
    assert sampler.sample() is None
    assert sampler.error is not None and "Driver Not Loaded" in sampler.error
    del gpus.system["nvml_error"]
    gpus.save()
    assert sampler.sample() is None  # not before the retry is due
    clock.advance(5.0)
    assert sampler.sample() is not None and sampler.error is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"utilization_gpu": 101}, "at most 100"),
        ({"utilization_gpu": "high"}, "expected int"),
        ({"processes": [{"used_memory_mib": 3}]}, "pid: required"),
        ({"processes": [{"pid": 1, "user": "x"}]}, "unknown field 'user'"),
        ({"processes": {"pid": 1}}, "expected a list of processes"),
    ],
)
def test_bad_usage_fields_in_the_fake_file_name_the_field(
    fields: dict[str, object], message: str
) -> None:
    import json

    raw = json.dumps({"devices": [{"index": 0, **fields}]}).encode()
    with pytest.raises(FakeFileError, match=message):
        parse_fake_file(raw, "nvml.json")
