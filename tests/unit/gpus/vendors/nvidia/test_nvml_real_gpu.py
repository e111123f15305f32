"""Checks against a real NVIDIA GPU (marker ``gpu``); they skip where NVML finds none.

Run them on a GPU machine with
``pytest -m gpu tests/unit/gpus/vendors/nvidia/test_nvml_real_gpu.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from allocator.gpus.inventory import Inventory
from allocator.gpus.probe import run_deep_probe
from allocator.gpus.vendors.nvidia.health import NvmlHealthMonitor
from allocator.placement.worker_env import worker_environments
from allocator.policy.model import Host, Job, Policy
from allocator.records.types import Assignment
from tests.support.fake_gpus import real_nvml_or_skip

pytestmark = pytest.mark.gpu


@pytest.fixture
def inventory() -> Inventory:
    return real_nvml_or_skip()  # type: ignore[no-any-return]


def real_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCATOR_", "CUDA_"))}
    return {**env, **extra}


def test_real_inventory_lists_gpus_with_uuids(inventory: Inventory) -> None:
    assert inventory.source == "nvml" and inventory.error is None
    assert inventory.indices == tuple(range(len(inventory.gpus)))
    assert all(gpu.uuid and gpu.uuid.startswith("GPU-") for gpu in inventory.gpus)
    assert all(gpu.pci_bus_id and gpu.memory_total_mib for gpu in inventory.gpus)
    assert inventory.driver_version and inventory.cuda_driver_version
    buses = [gpu.pci_bus_id for gpu in inventory.gpus]
    assert buses == sorted(buses, key=lambda bus: (bus or "").lower())  # PCI order
    for gpu in inventory.gpus:
        assert all(m.uuid.startswith("MIG-") for m in gpu.mig_devices)


def test_real_health_check_runs(inventory: Inventory) -> None:
    with NvmlHealthMonitor(environ=real_env()) as monitor:
        assert monitor.error is None
        first = monitor.check(0.0)
        second = monitor.check(1.0)
    assert [gpu.index for gpu in first.gpus] == list(inventory.indices)
    assert [gpu.index for gpu in second.gpus] == list(inventory.indices)


def torch_in_subprocess(env: dict[str, str], code: str) -> Any:
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if data.get("cuda_build") is None:
        pytest.skip("PyTorch here is a CPU-only build")
    return data


def test_torch_device_is_cuda0_with_a_one_gpu_mask(inventory: Inventory) -> None:
    last = inventory.gpus[-1]
    policy = Policy(
        version=1, hosts={"h": Host("h", len(inventory.gpus))}, jobs={"j": Job("j", ("x",))}
    )
    assignment = Assignment("j", "h", (last.index,), "gpu", "test", "now")
    (worker_env,) = worker_environments(assignment, inventory.gpus, policy)
    code = (
        "import json, sys, torch, allocator.torch as at\n"
        # A CPU-only build would (rightly) raise GpuUnavailableError: skip instead.
        "if torch.version.cuda is None: print(json.dumps({'cuda_build': None})); sys.exit()\n"
        "dev = at.configure()\n"
        "props = torch.cuda.get_device_properties(0)\n"
        "print(json.dumps({'cuda_build': torch.version.cuda, 'device': str(dev),"
        " 'count': torch.cuda.device_count(), 'uuid': str(props.uuid),"
        " 'scaler': at.grad_scaler().is_enabled()}))\n"
    )
    data = torch_in_subprocess(real_env(**worker_env), code)
    assert data["device"] == "cuda:0"
    assert data["count"] == 1
    expected = last.mig_devices[0].uuid if last.mig_enabled else last.uuid or ""
    assert expected.split("-", 1)[1] in data["uuid"]
    assert data["scaler"] is True


def test_real_deep_probe_passes_on_one_gpu(inventory: Inventory) -> None:
    first = inventory.gpus[0]
    env = real_env(CUDA_VISIBLE_DEVICES=first.uuid or "0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    torch_in_subprocess(
        env, "import json, torch; print(json.dumps({'cuda_build': torch.version.cuda}))"
    )
    result = run_deep_probe(env, 300.0)
    assert result.ok, result.reason


def test_real_gpus_publish_their_local_cpus_and_pcie_levels(inventory: Inventory) -> None:
    from allocator.gpus.topology import parse_cpu_list

    present = set(range(os.cpu_count() or 1))
    for gpu in inventory.gpus:
        assert gpu.cpu_affinity, f"GPU {gpu.index} reports no local CPUs"
        assert parse_cpu_list(gpu.cpu_affinity) <= present
        if len(inventory.gpus) > 1:
            assert len(gpu.pcie_levels) == len(inventory.gpus)
            assert gpu.pcie_levels[gpu.index] is None


def test_a_shared_workers_torch_stops_at_its_memory_share(inventory: Inventory) -> None:
    first = inventory.gpus[0]
    env = real_env(
        CUDA_VISIBLE_DEVICES=first.uuid or "0",
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        ALLOCATOR_DEVICE="cuda",
        ALLOCATOR_GPU_MEMORY_FRACTION="0.25",
    )
    code = (
        "import json, sys, torch, allocator.torch as at\n"
        "if torch.version.cuda is None: print(json.dumps({'cuda_build': None})); sys.exit()\n"
        "at.configure()\n"
        "total = torch.cuda.get_device_properties(0).total_memory\n"
        "small = torch.empty(int(total * 0.1), dtype=torch.uint8, device='cuda')\n"
        "try:\n"
        "    torch.empty(int(total * 0.3), dtype=torch.uint8, device='cuda'); big = True\n"
        "except torch.OutOfMemoryError:\n"
        "    big = False\n"
        "print(json.dumps({'cuda_build': torch.version.cuda, 'big': big}))\n"
    )
    assert torch_in_subprocess(env, code)["big"] is False
