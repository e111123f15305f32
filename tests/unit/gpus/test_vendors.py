"""The vendor layer: each vendor's inventory (through its fake) and worker environment."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from allocator.errors import RequestError
from allocator.gpus.inventory import from_nvml, keep_addresses
from allocator.gpus.vendors.amd.rocr_filter import rocr_uuid, visible_devices
from allocator.gpus.vendors.apple.vendor import mps_amp_problem
from allocator.gpus.vendors.base import CdiNames
from allocator.gpus.vendors.fake_file import FakeFileError, parse_fake_file
from allocator.gpus.vendors.intel.vendor import RealSysfs, read_intel_gpus
from allocator.gpus.vendors.nvidia.fake import FakeNvml
from allocator.gpus.vendors.registry import (
    VENDORS,
    TorchBuild,
    amp_problem,
    read_host_inventory,
    vendor_named,
)
from allocator.placement.worker_env import worker_environments
from allocator.policy.model import FallbackRule, Host, Job, Policy
from allocator.records.gpu_info import GpuInfo, MigDevice
from allocator.records.types import Assignment
from tests.support.fake_gpus import fake_device, fake_environ, write_fake_nvml

# KFD unique_ids of the two AMD GPUs, and ROCr's names for them.
AMD_SERIAL = (0x7A3E0C1D00000010, 0x7A3E0C1D00000021)
AMD_UUID = ("GPU-7A3E0C1D00000010", "GPU-7A3E0C1D00000021")


def policy() -> Policy:
    return Policy(
        version=1,
        hosts={"node1": Host("node1", 4)},
        jobs={"train": Job("train", ("python", "train.py"), fallback="cpu")},
        fallback={"cpu": FallbackRule("cpu", "cpu", threads=4)},
    )


def assign(gpus: tuple[int, ...], mode: str = "gpu") -> Assignment:
    return Assignment(
        job="train",
        host="node1",
        gpus=gpus,
        mode=mode,  # type: ignore[arg-type]
        updated_by="ops",
        updated_at="2026-01-01T00:00:00Z",
    )


def amd_file(tmp_path: Path, **system: Any) -> Path:
    # File order is not PCI order: the reader must index GPUs by PCI address.
    # File order stands for KFD order, which need not be PCI order either.
    devices = [
        fake_device(
            n,
            unique_id=AMD_SERIAL[n],
            pci_bus_id=bus,
            name="AMD Instinct MI300X",
            ecc_uncorrected=0,
        )
        for n, bus in enumerate(("00000000:C1:00.0", "00000000:03:00.0"))
    ]
    return write_fake_nvml(tmp_path / "amd.json", devices, vendor="amd", **system)


def test_amd_inventory_through_fake_amdsmi_in_pci_order(tmp_path: Path) -> None:
    inventory = read_host_inventory(environ=fake_environ(amd_file(tmp_path)))
    assert (inventory.vendor, inventory.source, inventory.error) == ("amd", "fake", None)
    assert [gpu.pci_bus_id for gpu in inventory.gpus] == ["0000:03:00.0", "0000:c1:00.0"]
    assert [gpu.uuid for gpu in inventory.gpus] == [AMD_UUID[1], AMD_UUID[0]]
    assert inventory.gpus[0].name == "AMD Instinct MI300X"


def test_amd_file_means_no_nvml(tmp_path: Path) -> None:
    lib = FakeNvml(amd_file(tmp_path))
    with pytest.raises(lib.NVMLError):
        lib.nvmlInit()


def test_amd_gpu_with_uncorrectable_ecc_or_lost_is_reported(tmp_path: Path) -> None:
    path = amd_file(tmp_path)
    write_fake_nvml(
        path,
        [fake_device(0, ecc_uncorrected=3), fake_device(1, lost=True)],
        vendor="amd",
    )
    gpus = read_host_inventory(environ=fake_environ(path)).gpus
    assert gpus[0].error == "3 uncorrectable ECC errors"
    assert gpus[1].error.startswith("amdsmi failed") and gpus[1].uuid is None


def test_amd_init_failure_falls_back_to_declared(tmp_path: Path) -> None:
    path = amd_file(tmp_path, init_error="driver_not_loaded")
    inventory = read_host_inventory(2, environ=fake_environ(path))
    assert (inventory.vendor, inventory.source) == ("amd", "declared")
    assert inventory.error is not None and "amdsmi_init failed" in inventory.error


def test_intel_inventory_from_fake_sysfs(tmp_path: Path) -> None:
    devices = [
        fake_device(0, pci_bus_id="00000000:9A:00.0", numa_node=1),
        fake_device(1, pci_bus_id="00000000:3A:00.0"),
        fake_device(2, lost=True),
    ]
    path = write_fake_nvml(tmp_path / "intel.json", devices, vendor="intel")
    inventory = read_host_inventory(environ=fake_environ(path))
    assert (inventory.vendor, inventory.source) == ("intel", "fake")
    assert [g.pci_bus_id for g in inventory.gpus] == ["0000:3a:00.0", "0000:9a:00.0"]
    assert [g.numa_node for g in inventory.gpus] == [None, 1]


def test_intel_reads_only_intel_cards_from_a_sysfs_tree(tmp_path: Path) -> None:
    def card(name: str, vendor: str, slot: str) -> None:
        device = tmp_path / "class" / "drm" / name / "device"
        device.mkdir(parents=True)
        (device / "vendor").write_text(f"{vendor}\n")
        (device / "device").write_text("0x0bd5\n")
        (device / "uevent").write_text(f"DRIVER=xe\nPCI_SLOT_NAME={slot}\n")

    card("card0", "0x10de", "0000:01:00.0")  # an NVIDIA card
    card("card1", "0x8086", "0000:29:00.0")
    (tmp_path / "class" / "drm" / "card1-DP-1").mkdir()
    (tmp_path / "class" / "drm" / "renderD129").mkdir()
    gpus = read_intel_gpus(RealSysfs(tmp_path))
    assert [(g.index, g.pci_bus_id, g.name) for g in gpus] == [
        (0, "0000:29:00.0", "Intel GPU 0x0bd5")
    ]


def test_apple_has_one_gpu(tmp_path: Path) -> None:
    path = write_fake_nvml(
        tmp_path / "mac.json", [fake_device(0, name="Apple M3 Max")], vendor="apple"
    )
    inventory = read_host_inventory(environ=fake_environ(path))
    assert inventory.vendor == "apple"
    assert [(g.index, g.name) for g in inventory.gpus] == [(0, "Apple M3 Max")]


def test_nvidia_file_reads_as_before(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nv.json", 2)
    inventory = read_host_inventory(environ=fake_environ(path))
    assert (inventory.vendor, inventory.source, len(inventory.gpus)) == ("nvidia", "fake", 2)


def test_unknown_vendor_in_fake_file_is_refused() -> None:
    with pytest.raises(FakeFileError, match="vendor"):
        parse_fake_file(b'{"vendor": "matrox", "devices": []}', "f.json")


def rocr_sees(env: dict[str, str], path: Path) -> list[str]:
    """The PCI addresses of the GPUs ROCr surfaces under ``env``, in device order."""
    system = parse_fake_file(path.read_bytes(), str(path))  # file order = KFD order
    kfd = [rocr_uuid(device.unique_id) for device in system.devices]
    shown = visible_devices(env.get("ROCR_VISIBLE_DEVICES"), kfd)
    return [system.devices[n].pci_bus_id[-12:].lower() for n in shown]


@pytest.mark.parametrize("gpus", [(1, 0), (0,), (1,)])
def test_amd_worker_sees_exactly_its_gpus_in_order(tmp_path: Path, gpus: tuple[int, ...]) -> None:
    path = amd_file(tmp_path)
    inventory = read_host_inventory(environ=fake_environ(path)).gpus
    (env,) = worker_environments(assign(gpus), inventory, policy(), vendor="amd")
    assert rocr_sees(env, path) == [inventory[gpu].pci_bus_id for gpu in gpus]
    # The whole environment: ROCr's filter alone (HIP's would index what ROCr left).
    assert env == {
        "ALLOCATOR_JOB": "train",
        "ALLOCATOR_HOST": "node1",
        "ALLOCATOR_VENDOR": "amd",
        "ROCR_VISIBLE_DEVICES": ",".join(inventory[gpu].uuid or "" for gpu in gpus),
        "ALLOCATOR_DEVICE": "cuda",
        "ALLOCATOR_GPUS": ",".join(map(str, gpus)),
        "ALLOCATOR_GPU_COUNT": str(len(gpus)),
    }


def test_amd_uuid_rocr_would_refuse_gives_way_to_indices() -> None:
    # An older agent's record: amdsmi's 36-character UUID, which would hide every GPU.
    inventory = [GpuInfo(index=0, uuid="GPU-7a3e0c1d-0000-1000-8000-000000000001")]
    (env,) = worker_environments(assign((0,)), inventory, policy(), vendor="amd")
    assert env["ROCR_VISIBLE_DEVICES"] == "0"


def test_amd_cpu_fallback_hides_every_gpu(tmp_path: Path) -> None:
    (env,) = worker_environments(assign((), mode="cpu"), None, policy(), vendor="amd")
    assert rocr_sees(env, amd_file(tmp_path)) == []
    assert env == {
        "ALLOCATOR_JOB": "train",
        "ALLOCATOR_HOST": "node1",
        "ALLOCATOR_VENDOR": "amd",
        "ROCR_VISIBLE_DEVICES": "-1",
        "ALLOCATOR_DEVICE": "cpu",
        "ALLOCATOR_GPUS": "",
        "ALLOCATOR_GPU_COUNT": "0",
        "ALLOCATOR_FALLBACK_REASON": "assigned to CPU",
        "OMP_NUM_THREADS": "4",
        "MKL_NUM_THREADS": "4",
        "ALLOCATOR_THREADS": "4",
    }


def test_intel_worker_gets_the_level_zero_mask() -> None:
    (env,) = worker_environments(assign((2, 0)), None, policy(), vendor="intel")
    assert env["ZE_AFFINITY_MASK"] == "0,2" == env["ALLOCATOR_GPUS"]  # Level Zero does not reorder
    assert env["ZE_ENABLE_PCI_ID_DEVICE_ORDER"] == "1"
    assert env["ONEAPI_DEVICE_SELECTOR"] == "level_zero:*"
    assert (env["ALLOCATOR_DEVICE"], env["ALLOCATOR_VENDOR"]) == ("xpu", "intel")
    assert "CUDA_VISIBLE_DEVICES" not in env
    (cpu,) = worker_environments(assign((), mode="cpu"), None, policy(), vendor="intel")
    assert cpu["ONEAPI_DEVICE_SELECTOR"] == "opencl:cpu" and "ZE_AFFINITY_MASK" not in cpu


def test_apple_worker_uses_mps_with_nothing_to_mask() -> None:
    (env,) = worker_environments(assign((0,)), None, policy(), vendor="apple")
    assert env["ALLOCATOR_DEVICE"] == "mps"
    assert not any(name.endswith("VISIBLE_DEVICES") for name in env)
    with pytest.raises(RequestError, match="one GPU"):
        worker_environments(assign((0, 1)), None, policy(), vendor="apple")


def test_nvidia_is_the_default_vendor() -> None:
    (env,) = worker_environments(assign((1,)), None, policy())
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["ALLOCATOR_VENDOR"] == "nvidia"


KNOWN = {
    0: GpuInfo(
        index=0, uuid="GPU-a", pci_bus_id="0000:03:00.0", drm_card=1, pci_device_id="0x56c0"
    ),
    1: GpuInfo(index=1, mig_enabled=True, mig_devices=(MigDevice(uuid="MIG-b"),)),
}


@pytest.mark.parametrize(
    ("vendor", "naming", "names"),
    [
        # nvidia-ctk (pkg/nvcdi): by UUID, MIG instances by their UUID.
        ("nvidia", "card", ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=MIG-b"]),
        # ROCm's container toolkit: by index, whatever the UUID.
        ("amd", "card", ["amd.com/gpu=0", "amd.com/gpu=1"]),
    ],
)
def test_cdi_device_names(vendor: str, naming: CdiNames, names: list[str]) -> None:
    assert vendor_named(vendor).cdi_devices([0, 1], KNOWN, naming) == names


def test_intel_cdi_names_follow_the_hosts_generator_and_apple_has_none() -> None:
    intel = vendor_named("intel")
    assert intel.cdi_devices([0], KNOWN, "card") == ["intel.com/gpu=card1"]
    assert intel.cdi_devices([0], KNOWN, "pci") == ["intel.com/gpu=0000-03-00-0-0x56c0"]
    with pytest.raises(RequestError, match="Apple"):
        vendor_named("apple").cdi_devices([0], KNOWN, "card")


CUDA_WHEEL = TorchBuild("2.5.1+cu124", cuda="12.4", hip=None, xpu=False, mps=False)
ROCM_WHEEL = TorchBuild("2.5.1+rocm6.2", cuda=None, hip="6.2.41133", xpu=False, mps=False)
CPU_WHEEL = TorchBuild("2.5.1+cpu", cuda=None, hip=None, xpu=False, mps=False)


def test_torch_build_against_vendor() -> None:
    problem = VENDORS["amd"].torch_build_problem(CUDA_WHEEL)
    assert problem is not None and "CUDA build" in problem and "ROCm" in problem
    assert VENDORS["amd"].torch_build_problem(ROCM_WHEEL) is None
    assert VENDORS["nvidia"].torch_build_problem(CUDA_WHEEL) is None
    assert "ROCm build" in (VENDORS["nvidia"].torch_build_problem(ROCM_WHEEL) or "")
    assert "XPU" in (VENDORS["intel"].torch_build_problem(CPU_WHEEL) or "")


def test_unknown_vendor_name() -> None:
    with pytest.raises(ValueError, match="unknown GPU vendor 'matrox'"):
        vendor_named("matrox")


def test_a_card_gone_from_sysfs_keeps_its_index_and_is_marked(tmp_path: Path) -> None:
    devices = [fake_device(i, pci_bus_id=f"00000000:{0x30 + i:02X}:00.0") for i in range(3)]
    path = write_fake_nvml(tmp_path / "intel.json", devices, vendor="intel")
    before = read_host_inventory(environ=fake_environ(path))
    devices[0]["lost"] = True  # card0 leaves sysfs: the reader alone would renumber the rest
    write_fake_nvml(path, devices, vendor="intel")
    after = keep_addresses(before, read_host_inventory(environ=fake_environ(path)))
    assert [(g.index, g.pci_bus_id) for g in after.gpus] == [
        (0, "0000:30:00.0"),
        (1, "0000:31:00.0"),
        (2, "0000:32:00.0"),
    ]
    assert after.gpus[0].error == "gone from the bus (no GPU at 0000:30:00.0 now)"
    assert not after.gpus[1].error and not after.gpus[2].error
    devices.append(fake_device(3, pci_bus_id="00000000:20:00.0"))  # a new card, lowest address
    devices[0]["lost"] = False
    write_fake_nvml(path, devices, vendor="intel")
    again = keep_addresses(after, read_host_inventory(environ=fake_environ(path)))
    assert [(g.index, g.pci_bus_id, g.error) for g in again.gpus][::3] == [
        (0, "0000:30:00.0", ""),
        (3, "0000:20:00.0", ""),
    ]


def test_an_unknown_vendor_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="host node1: unknown GPU vendor 'qualcomm'"):
        worker_environments(assign((0,)), None, policy(), vendor="qualcomm")


def test_amd_not_supported_is_no_signal(tmp_path: Path) -> None:
    # No ECC count and no NUMA node (amdsmi: NOT_SUPPORTED, as without DRM on a VM guest).
    path = write_fake_nvml(tmp_path / "amd.json", [fake_device(0), fake_device(1)], vendor="amd")
    gpus = read_host_inventory(environ=fake_environ(path)).gpus
    assert [(gpu.error, gpu.numa_node) for gpu in gpus] == [("", None), ("", None)]
    assert all(gpu.uuid and gpu.memory_total_mib for gpu in gpus)


@pytest.mark.parametrize("mode", ["off", ""])
def test_no_library_answering_means_the_policys_vendor(mode: str) -> None:
    environ = {"ALLOCATOR_NVML": mode, "PATH": "/usr/bin:/bin"}
    if from_nvml(read_host_inventory(2, environ=environ)):
        pytest.skip("a device library answers on this machine")
    inventory = read_host_inventory(2, environ=environ, vendor="amd")
    assert (inventory.vendor, inventory.source, len(inventory.gpus)) == ("amd", "declared", 2)
    (env,) = worker_environments(assign((1,)), inventory.gpus, policy(), vendor=inventory.vendor)
    assert env["ROCR_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES" not in env
    assert read_host_inventory(2, environ=environ).vendor == "nvidia"  # no vendor said


def test_amd_gpu_without_a_unique_id_is_named_by_index(tmp_path: Path) -> None:
    # asic_serial N/A: ROCr gives the GPU no UUID, so every GPU of the job goes by index.
    devices = [fake_device(0, unique_id=0), fake_device(1)]
    path = write_fake_nvml(tmp_path / "amd.json", devices, vendor="amd")
    inventory = read_host_inventory(environ=fake_environ(path)).gpus
    assert inventory[0].uuid is None and inventory[1].uuid
    (env,) = worker_environments(assign((1, 0)), inventory, policy(), vendor="amd")
    assert env["ROCR_VISIBLE_DEVICES"] == "1,0"
    assert rocr_sees(env, path) == [inventory[1].pci_bus_id, inventory[0].pci_bus_id]


@pytest.mark.parametrize(
    ("version", "autocast", "scaler"),
    [
        ("2.3.1", "2.5", "2.8"),
        ("2.4.1+cpu", "2.5", "2.8"),
        ("2.5.0", None, "2.8"),
        ("2.7.1", None, "2.8"),
        ("2.8.0a0+gitabc123", None, None),
        ("2.13.0", None, None),
        ("10.0", None, None),
        ("unknown", None, None),
    ],
)
def test_mixed_precision_on_mps_by_torch_version(
    version: str, autocast: str | None, scaler: str | None
) -> None:
    for feature, needed in (("autocast", autocast), ("grad_scaler", scaler)):
        problem = mps_amp_problem(feature, version)  # type: ignore[arg-type]
        assert (problem is None) == (needed is None), (feature, version)
        if needed is not None:
            assert f"needs PyTorch {needed} or newer" in str(problem)


def test_the_torch_floor_has_autocast_on_mps_and_doctor_names_an_older_one() -> None:
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    floor = next(req for req in extras["torch"] if req.startswith("torch>="))
    assert mps_amp_problem("autocast", floor.removeprefix("torch>=")) is None
    old = TorchBuild("2.4.1", cuda=None, hip=None, xpu=False, mps=True)
    assert "autocast on mps" in (VENDORS["apple"].torch_build_problem(old) or "")
    middle = TorchBuild("2.7.1", cuda=None, hip=None, xpu=False, mps=True)
    assert "GradScaler.step() on mps" in (VENDORS["apple"].torch_build_problem(middle) or "")
    new = TorchBuild("2.8.0", cuda=None, hip=None, xpu=False, mps=True)
    assert VENDORS["apple"].torch_build_problem(new) is None


def test_mixed_precision_is_checked_by_the_vendors_of_the_device_type() -> None:
    assert "GradScaler.step() on mps" in (amp_problem("mps", "grad_scaler", "2.7.1") or "")
    assert amp_problem("mps", "autocast", "2.7.1") is None
    # cuda (NVIDIA's and ROCm's), xpu and cpu have no floor of their own.
    for device_type in ("cuda", "xpu", "cpu"):
        assert amp_problem(device_type, "autocast", "2.0.0") is None
