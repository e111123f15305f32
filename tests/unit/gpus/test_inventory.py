"""Inventory from the fake NVML, the declared fallback, and NVML failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.gpus.inventory import Inventory, cuda_version_text, keep_last_good
from allocator.gpus.vendors.fake_file import DEFAULT_MEMORY_MIB, DEFAULT_NAME, default_uuid
from allocator.gpus.vendors.nvidia.vendor import read_inventory
from allocator.records.gpu_info import GpuInfo
from tests.support.fake_gpus import fake_device, fake_environ, write_fake_nvml

H100 = "NVIDIA H100 80GB HBM3"


def test_fake_inventory_reports_every_field(tmp_path: Path) -> None:
    path = write_fake_nvml(
        tmp_path / "nvml.json",
        [
            fake_device(
                0,
                uuid="GPU-6f1c2a53-0000-4000-8000-000000000000",
                pci_bus_id="00000000:17:00.0",
                name=H100,
                memory_total_mib=81559,
                numa_node=0,
                nvlink_peers=[1],
            ),
            fake_device(
                1,
                uuid="GPU-6f1c2a53-0000-4000-8000-000000000001",
                pci_bus_id="00000000:2A:00.0",
                nvlink_peers=[0],
                mig_devices=["MIG-aaaa", {"uuid": "MIG-bbbb", "name": "3g.40gb"}],
            ),
        ],
        driver_version="550.54.15",
        cuda_driver_version=12040,
    )
    inventory = read_inventory(environ=fake_environ(path))
    assert inventory.source == "fake"
    assert inventory.error is None
    assert inventory.driver_version == "550.54.15"
    assert inventory.cuda_driver_version == 12040
    first, second = inventory.gpus
    assert (first.index, first.uuid, first.pci_bus_id) == (
        0,
        "GPU-6f1c2a53-0000-4000-8000-000000000000",
        "00000000:17:00.0",
    )
    assert (first.name, first.memory_total_mib, first.numa_node) == (H100, 81559, 0)
    assert first.nvlink_peers == (1,)
    assert not first.mig_enabled
    assert second.nvlink_peers == (0,)
    assert second.mig_enabled
    assert [m.uuid for m in second.mig_devices] == ["MIG-aaaa", "MIG-bbbb"]
    assert second.mig_devices[1].name == "3g.40gb"
    assert second.numa_node is None  # not given: NVML "not supported" -> None


def test_fake_defaults_are_deterministic(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 3)
    inventory = read_inventory(environ=fake_environ(path))
    assert inventory.indices == (0, 1, 2)
    assert [g.uuid for g in inventory.gpus] == [default_uuid(i) for i in range(3)]
    assert len({g.pci_bus_id for g in inventory.gpus}) == 3
    assert all(g.name == DEFAULT_NAME for g in inventory.gpus)
    assert all(g.memory_total_mib == DEFAULT_MEMORY_MIB for g in inventory.gpus)
    assert all(g.nvlink_peers == () for g in inventory.gpus)
    assert read_inventory(environ=fake_environ(path)) == inventory


def test_pci_bus_order_follows_index_even_if_file_lists_devices_out_of_order(
    tmp_path: Path,
) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", [fake_device(1), fake_device(0)])
    assert read_inventory(environ=fake_environ(path)).indices == (0, 1)


def test_lost_gpu_keeps_its_index_and_the_error(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", [fake_device(0), fake_device(1, lost=True)])
    inventory = read_inventory(environ=fake_environ(path))
    assert inventory.source == "fake"
    healthy, lost = inventory.gpus
    assert healthy.uuid == default_uuid(0)
    assert lost.index == 1 and lost.uuid is None
    assert "lost" in lost.error


@pytest.mark.parametrize("declared", [None, 0, 4])
def test_nvml_off_falls_back_to_the_declared_count(declared: int | None) -> None:
    inventory = read_inventory(declared, environ={"ALLOCATOR_NVML": "off"})
    assert inventory.error is not None and "ALLOCATOR_NVML=off" in inventory.error
    assert inventory.error.startswith("no GPUs found")
    if declared is None:
        assert inventory.source == "none" and inventory.gpus == ()
    else:
        assert inventory.source == "declared"
        assert inventory.gpus == tuple(GpuInfo(index=i) for i in range(declared))


def test_unknown_nvml_setting_is_reported_not_raised() -> None:
    inventory = read_inventory(2, environ={"ALLOCATOR_NVML": "fake"})
    assert inventory.source == "declared"
    assert inventory.error is not None and "'fake'" in inventory.error


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"devices": [', "line 1"),
        ('{"devices": [{"index": 0, "heathy": false}]}', "'heathy'"),
        ('{"devices": [{"index": "0"}]}', "devices[0].index"),
        ('{"devices": [{"index": 0, "memory_total_mib": true}]}', "memory_total_mib"),
        ('{"devices": [{"index": 0}, {"index": 2}]}', "indices must be 0..1"),
        ('{"devices": [{"index": 0, "nvlink_peers": [0]}]}', "nvlink_peers"),
        ('{"devices": [{"name": "x"}]}', "index: required"),
        ('{"devices": [], "init_error": "nope"}', "init_error"),
        ("[]", "expected an object"),
    ],
)
def test_malformed_fake_file_is_an_error_naming_the_file(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_text(content)
    inventory = read_inventory(2, environ=fake_environ(path))
    assert inventory.source == "declared"
    assert inventory.error is not None
    assert str(path) in inventory.error
    assert expected in inventory.error


def test_missing_fake_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    inventory = read_inventory(environ=fake_environ(path))
    assert inventory.source == "none"
    assert inventory.error is not None and str(path) in inventory.error


@pytest.mark.parametrize(
    ("init_error", "expected"),
    [("driver_not_loaded", "driver not loaded"), ("library_not_found", "libnvidia-ml.so.1")],
)
def test_nvml_init_failure_means_no_gpus_with_the_reason(
    tmp_path: Path, init_error: str, expected: str
) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2, init_error=init_error)
    inventory = read_inventory(8, environ=fake_environ(path))
    assert inventory.source == "declared"
    assert len(inventory.gpus) == 8
    assert inventory.error is not None and expected in inventory.error


def test_missing_nvidia_ml_py_is_reported_with_the_extra_to_install() -> None:
    code = (
        "import sys, json; sys.modules['pynvml'] = None\n"
        "from allocator.gpus.vendors.nvidia.vendor import read_inventory\n"
        "inv = read_inventory(3, environ={})\n"
        "print(json.dumps([inv.source, len(inv.gpus), inv.error]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    source, count, error = json.loads(out.stdout)
    assert (source, count) == ("declared", 3)
    assert "nvidia-ml-py" in error and "gpu-allocator[nvml]" in error


def test_real_nvml_never_crashes() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ALLOCATOR_NVML"}
    inventory = read_inventory(2, environ=env)
    if inventory.source == "nvml":
        assert inventory.error is None and inventory.driver_version
    else:
        assert inventory.source == "declared" and len(inventory.gpus) == 2
        assert inventory.error is not None and inventory.error.startswith("no GPUs found")


@pytest.mark.parametrize(
    ("version", "text"), [(12040, "12.4"), (11080, "11.8"), (13000, "13.0"), (None, None)]
)
def test_cuda_version_text(version: int | None, text: str | None) -> None:
    assert cuda_version_text(version) == text


def test_inventory_dict_round_trips_through_gpu_info(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", [fake_device(0, mig_devices=["MIG-x"])])
    data = json.loads(json.dumps(read_inventory(environ=fake_environ(path)).to_dict()))
    assert data["source"] == "fake" and data["cuda_driver"] == "12.4"
    gpu = GpuInfo.from_dict(data["gpus"][0])
    assert gpu.mig_enabled and gpu.mig_devices[0].uuid == "MIG-x"


def test_gpu_modules_import_neither_pynvml_nor_torch() -> None:
    code = (
        "import sys\n"
        "import allocator.doctor.checks, allocator.gpus.inventory\n"
        "import allocator.gpus.vendors.nvidia.health\n"
        "import allocator.gpus.probe, allocator.placement.worker_env, allocator.worker\n"
        "print(sorted({'pynvml', 'torch'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- keeping the last good inventory (a long-running reader) ---------------------------


def test_a_failed_read_keeps_the_last_good_inventory_with_the_new_error(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2)
    good = read_inventory(environ=fake_environ(path))
    write_fake_nvml(path, 2, nvml_error="unknown")
    failed = read_inventory(2, environ=fake_environ(path))
    assert failed.source == "declared" and failed.gpus[0].uuid is None
    kept = keep_last_good(good, failed)
    assert kept.gpus == good.gpus and kept.source == "fake"
    assert kept.error is not None and "Unknown Error" in kept.error


def test_a_gpu_that_fails_to_answer_keeps_its_uuid(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2)
    good = read_inventory(environ=fake_environ(path))
    write_fake_nvml(path, [fake_device(0), fake_device(1, lost=True)])
    fresh = read_inventory(environ=fake_environ(path))
    assert fresh.gpus[1].uuid is None and fresh.gpus[1].error
    kept = keep_last_good(good, fresh)
    assert kept.gpus[1].uuid == default_uuid(1)
    assert kept.gpus[1].error == fresh.gpus[1].error


def test_without_a_good_read_the_declared_count_stands_in(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2, nvml_error="unknown")
    failed = read_inventory(3, environ=fake_environ(path))
    assert keep_last_good(None, failed) == failed
    assert failed.indices == (0, 1, 2)


def test_an_inventory_round_trips_through_to_dict(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2)
    inventory = read_inventory(environ=fake_environ(path))
    assert Inventory.from_dict(json.loads(json.dumps(inventory.to_dict()))) == inventory
