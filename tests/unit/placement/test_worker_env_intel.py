"""Intel workers through Level Zero's own rule: exactly the assigned GPUs, in which order.

The environment a worker gets is run through :mod:`tests.support.level_zero`
(a port of the driver's ``ZE_AFFINITY_MASK`` parser): the mask does not
reorder, so ``xpu:0`` is the assigned GPU lowest in PCI order, and
``ALLOCATOR_GPUS`` must list the GPUs in that order too.
"""

from __future__ import annotations

from allocator.placement.worker_env import worker_environments
from allocator.policy.model import Host, Job, Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment
from tests.support.level_zero import Card, Device, level_zero_devices

# Four two-tile cards (Data Center GPU Max 1550), found by the driver out of PCI order.
PCI = ["0000:18:00.0", "0000:42:00.0", "0000:6c:00.0", "0000:9a:00.0"]
DISCOVERED = [Card(PCI[2], 2), Card(PCI[0], 2), Card(PCI[3], 2), Card(PCI[1], 2)]
INVENTORY = [GpuInfo(index, pci_bus_id=pci) for index, pci in enumerate(PCI)]


def policy(workers: str = "single") -> Policy:
    job = Job("train", ("python", "train.py"), workers=workers)  # type: ignore[arg-type]
    return Policy(version=1, hosts={"node1": Host("node1", 4)}, jobs={"train": job})


def assign(gpus: tuple[int, ...]) -> Assignment:
    return Assignment(
        job="train",
        host="node1",
        gpus=gpus,
        mode="gpu",
        updated_by="ops",
        updated_at="2026-01-01T00:00:00Z",
    )


def seen(env: dict[str, str]) -> list[int]:
    """The inventory indices of the cards the worker enumerates, xpu:0 first (whole cards)."""
    devices = level_zero_devices(env, DISCOVERED)
    assert all(device.tiles == (0, 1) for device in devices), devices
    return [PCI.index(device.pci) for device in devices]


def test_the_intel_worker_environment_whole() -> None:
    (env,) = worker_environments(assign((3, 1)), INVENTORY, policy(), vendor="intel")
    assert env == {
        "ALLOCATOR_JOB": "train",
        "ALLOCATOR_HOST": "node1",
        "ALLOCATOR_VENDOR": "intel",
        "ZE_AFFINITY_MASK": "1,3",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
        "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
        "ONEAPI_DEVICE_SELECTOR": "level_zero:*",
        "ALLOCATOR_DEVICE": "xpu",
        "ALLOCATOR_GPUS": "1,3",
        "ALLOCATOR_GPU_COUNT": "2",
    }


def test_the_runtime_sees_exactly_the_assigned_gpus_in_allocator_gpus_order() -> None:
    for gpus in [(3, 1), (2, 0, 3), (0,), (1, 2)]:
        (env,) = worker_environments(assign(gpus), INVENTORY, policy(), vendor="intel")
        listed = [int(gpu) for gpu in env["ALLOCATOR_GPUS"].split(",")]
        assert seen(env) == listed, gpus  # xpu:i is ALLOCATOR_GPUS[i]
        assert sorted(listed) == sorted(gpus)


def test_each_per_gpu_worker_sees_its_own_card_alone() -> None:
    envs = worker_environments(assign((3, 0)), INVENTORY, policy("per-gpu"), vendor="intel")
    assert [seen(env) for env in envs] == [[int(env["ALLOCATOR_GPUS"])] for env in envs]
    assert sorted(int(env["ALLOCATOR_GPUS"]) for env in envs) == [0, 3]


def test_without_composite_the_mask_counts_tiles_and_picks_the_wrong_cards() -> None:
    (env,) = worker_environments(assign((3, 1)), INVENTORY, policy(), vendor="intel")
    del env["ZE_FLAT_DEVICE_HIERARCHY"]  # the driver's default, FLAT
    assert level_zero_devices(env, DISCOVERED) == [Device(PCI[0], (1,)), Device(PCI[1], (1,))]


def test_the_level_zero_rule() -> None:
    cards = [Card("b", 1), Card("a", 2), Card("c", 1)]
    ordered = {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}
    assert level_zero_devices(ordered, cards) == [
        Device("a", (0, 1)),
        Device("b", (0,)),
        Device("c", (0,)),
    ]
    # The mask's order is not the order: driver order kept, renumbered from 0.
    assert level_zero_devices({**ordered, "ZE_AFFINITY_MASK": "2,0"}, cards) == [
        Device("a", (0, 1)),
        Device("c", (0,)),
    ]
    # A sub-device alone; an index past the end is skipped; "default" means every device.
    assert level_zero_devices({**ordered, "ZE_AFFINITY_MASK": "0.1,7"}, cards) == [
        Device("a", (1,))
    ]
    assert level_zero_devices({**ordered, "ZE_AFFINITY_MASK": "default"}, cards) == (
        level_zero_devices(ordered, cards)
    )
    # Without PCI ordering, the driver's discovery order; FLAT (default) numbers tiles.
    assert [d.pci for d in level_zero_devices({"ZE_AFFINITY_MASK": "0,1,3"}, cards)] == [
        "b",
        "a",
        "c",
    ]
