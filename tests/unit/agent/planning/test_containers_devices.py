"""A container's devices: CDI names as each vendor's generator writes them, visibility
variables as the container numbers its devices, the device nodes' groups for a job user."""

from __future__ import annotations

import pytest

from allocator.agent.planning.containers import container_argv, container_run
from allocator.errors import RequestError
from allocator.placement.worker_env import worker_environments
from allocator.policy import load_policy
from allocator.policy.model import Container, Policy
from allocator.records.gpu_info import GpuInfo, MigDevice
from allocator.records.types import Assignment

HOST = "node7"
BOX = Container(image="train:1")
NVIDIA = (
    GpuInfo(index=0, uuid="GPU-0000"),
    GpuInfo(index=1, uuid="GPU-0001"),
    GpuInfo(index=2, uuid="GPU-0002", mig_enabled=True, mig_devices=(MigDevice(uuid="MIG-2a"),)),
    GpuInfo(index=3),  # NVML could not say its UUID
)
AMD = tuple(GpuInfo(index=i, uuid=f"GPU-{i:016x}", pci_bus_id=f"0000:0{i}:00.0") for i in range(4))
# Intel's cards: card0 is the host's display adapter (another vendor's), so the first
# Intel GPU is card1; the PCI device id is the DRA driver's name's last part.
INTEL = tuple(
    GpuInfo(index=i, pci_bus_id=f"0000:{3 + i:02x}:00.0", drm_card=i + 1, pci_device_id="0x56c0")
    for i in range(4)
)


def _devices(
    vendor: str, gpus: tuple[int, ...], inventory: tuple[GpuInfo, ...], naming: str = "card"
) -> list[str]:
    run = container_run(
        BOX,
        host=HOST,
        job="t",
        index=0,
        revision=1,
        gpus=gpus,
        inventory=inventory,
        vendor=vendor,
        cdi_names=naming,
    )
    return [w for w in run.device_options if w != "--device"]


def test_nvidia_gpus_are_named_by_uuid_mig_by_instance_uuid_else_by_index() -> None:
    assert _devices("nvidia", (1, 2, 3), NVIDIA) == [
        "nvidia.com/gpu=GPU-0001",
        "nvidia.com/gpu=MIG-2a",
        "nvidia.com/gpu=3",
    ]


def test_amd_gpus_are_named_by_index_as_the_rocm_toolkit_names_them() -> None:
    assert _devices("amd", (2, 0), AMD) == ["amd.com/gpu=2", "amd.com/gpu=0"]


def test_intel_gpus_are_named_card_n_or_by_pci_id_as_the_host_spec_says() -> None:
    assert _devices("intel", (0, 2), INTEL) == ["intel.com/gpu=card1", "intel.com/gpu=card3"]
    assert _devices("intel", (1,), INTEL, "pci") == ["intel.com/gpu=0000-04-00-0-0x56c0"]
    with pytest.raises(RequestError, match="card"):
        _devices("intel", (0,), (GpuInfo(index=0),))


def test_an_apple_gpu_is_never_passed_to_a_container_as_nvidias() -> None:
    with pytest.raises(RequestError, match="Apple"):
        _devices("apple", (0,), (GpuInfo(index=0),))


def _policy(visible: str) -> Policy:
    return load_policy(
        f"""
version: 1
visible_devices: {visible}
hosts: {{{HOST}: {{gpus: 4}}}}
jobs:
  box: {{command: [go], container: {{image: train:1}}}}
  each: {{command: [go], workers: per-gpu, container: {{image: train:1}}}}
  host: {{command: [go]}}
"""
    )


def _env(
    job: str,
    gpus: tuple[int, ...],
    vendor: str,
    inventory: tuple[GpuInfo, ...],
    visible: str = "uuid",
) -> list[dict[str, str]]:
    assignment = Assignment(
        job=job, host=HOST, gpus=gpus, mode="gpu", updated_by="t", updated_at="now"
    )
    return worker_environments(assignment, inventory, _policy(visible), vendor=vendor)


def test_a_container_numbers_its_devices_from_zero_nvidia_indices_are_container_local() -> None:
    (env,) = _env("box", (3, 1), "nvidia", NVIDIA, "index")
    # The container has GPUs 1 and 3, PCI-ordered as cuda 0 and 1: GPU 3 is its 1.
    assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
    (uuids,) = _env("box", (1, 0), "nvidia", NVIDIA)
    assert uuids["CUDA_VISIBLE_DEVICES"] == "GPU-0001,GPU-0000"
    # The devices come from the CDI spec: the legacy hook must inject nothing more.
    assert uuids["NVIDIA_VISIBLE_DEVICES"] == "void"
    (host,) = _env("host", (3, 1), "nvidia", NVIDIA, "index")
    assert host["CUDA_VISIBLE_DEVICES"] == "3,1"  # a host process keeps NVML's numbering


def test_per_gpu_containers_each_see_their_one_gpu_as_zero() -> None:
    envs = _env("each", (2, 3), "intel", INTEL)
    assert [e["ZE_AFFINITY_MASK"] for e in envs] == ["0", "0"]
    amd = _env("each", (1, 3), "amd", (*AMD[:3], GpuInfo(index=3)))
    assert [e["ROCR_VISIBLE_DEVICES"] for e in amd] == [AMD[1].uuid, "0"]


def test_intel_and_amd_containers_get_container_numbers_or_the_rocr_uuid() -> None:
    (intel,) = _env("box", (3, 2), "intel", INTEL)
    # Level Zero never reorders: the container's cards 0 and 1 in PCI order.
    assert (intel["ZE_AFFINITY_MASK"], intel["ALLOCATOR_GPUS"]) == ("0,1", "2,3")
    (amd,) = _env("box", (2, 0), "amd", AMD)
    assert amd["ROCR_VISIBLE_DEVICES"] == f"{AMD[2].uuid},{AMD[0].uuid}"
    (no_uuid,) = _env("box", (2, 0), "amd", tuple(GpuInfo(index=i) for i in range(4)))
    assert no_uuid["ROCR_VISIBLE_DEVICES"] == "1,0"


def test_a_job_user_gets_the_device_nodes_groups_on_amd_and_intel_only() -> None:
    def argv(vendor: str, user: str | None) -> tuple[str, ...]:
        run = container_run(
            BOX, host=HOST, job="t", index=0, revision=1, gpus=(0,), inventory=INTEL, vendor=vendor
        )
        return container_argv(
            run, name="n", env_names=(), argv=("go",), user=user, group_ids=(108, 44)
        )

    def added(words: tuple[str, ...]) -> list[str]:
        return [words[i + 1] for i, w in enumerate(words) if w == "--group-add"]

    assert added(argv("amd", "1000:1000")) == ["108", "44"]
    assert added(argv("intel", "1000:1000")) == ["108", "44"]
    assert added(argv("amd", None)) == []  # root opens any node
    assert added(argv("nvidia", "1000:1000")) == []  # /dev/nvidia* are 0666
