"""GPU topology from NVML (through the fake): CPU affinity, PCIe levels, and how sets are worded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.gpus.topology import Links, cpu_list, cpus_from_mask, parse_cpu_list
from allocator.gpus.vendors.fake_file import FakeFileError, parse_fake_file
from allocator.gpus.vendors.nvidia.fake import FakeNvml
from allocator.gpus.vendors.nvidia.vendor import read_inventory
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import AgentRecord
from tests.support.fake_gpus import fake_device, fake_environ, write_fake_nvml


@given(st.sets(st.integers(0, 600), max_size=40))
def test_a_cpu_list_reads_back_as_the_cpus_it_was_made_from(cpus: set[int]) -> None:
    assert parse_cpu_list(cpu_list(cpus)) == cpus


def test_cpu_lists_are_written_as_linux_writes_them() -> None:
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert cpu_list(()) == ""


@pytest.mark.parametrize("text", ["0-", "a", "3-1", "1,,2", "-1", "0x3"])
def test_a_malformed_cpu_list_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(text)


def test_nvml_cpu_masks_count_64_cpus_a_word() -> None:
    assert cpus_from_mask([0b101, 1 << 63, 1]) == {0, 2, 127, 128}


def test_the_inventory_carries_each_gpus_local_cpus_and_pcie_levels(tmp_path: Path) -> None:
    path = write_fake_nvml(
        tmp_path / "gpus.json",
        [
            fake_device(0, numa_node=0, cpu_affinity="0-27,56-83", pcie={"1": "switch"}),
            fake_device(1, numa_node=0, cpu_affinity="0-27,56-83", pcie={"2": "system"}),
            fake_device(2, numa_node=1, cpu_affinity="28-55,84-111", pcie={"0": "system"}),
        ],
    )
    inventory = read_inventory(environ=fake_environ(path))
    assert inventory.error is None
    gpu0, gpu1, gpu2 = inventory.gpus
    assert gpu0.cpu_affinity == "0-27,56-83" and gpu2.cpu_affinity == "28-55,84-111"
    assert gpu0.pcie_levels == (None, "switch", "system")
    assert gpu1.pcie_levels == ("switch", None, "system")  # named by GPU 0, and both ways
    assert gpu2.pcie_levels == ("system", "system", None)
    record = AgentRecord(host="n1", gpus=inventory.gpus)
    assert AgentRecord.from_json(record.to_json()) == record


def test_a_gpu_the_file_says_nothing_about_publishes_no_topology(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "gpus.json", 2)
    gpus = read_inventory(environ=fake_environ(path)).gpus
    assert [(g.cpu_affinity, g.pcie_levels) for g in gpus] == [(None, ()), (None, ())]


def test_the_fake_answers_affinity_in_the_callers_mask_size(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "gpus.json", [fake_device(0, cpu_affinity="1,64,130")])
    nvml = FakeNvml(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetCpuAffinity(handle, 3) == [2, 1, 4]
    assert nvml.nvmlDeviceGetCpuAffinity(handle, 1) == [2]  # CPUs past the array are dropped


@pytest.mark.parametrize(
    ("devices", "words"),
    [
        ([fake_device(0, pcie={"1": "bridge"}), fake_device(1)], "is not one of board"),
        ([fake_device(0, pcie={"0": "switch"}), fake_device(1)], "no other GPU 0"),
        ([fake_device(0, pcie={"x": "switch"}), fake_device(1)], "'x' is not a GPU index"),
        (
            [fake_device(0, pcie={"1": "switch"}), fake_device(1, pcie={"0": "node"})],
            "GPU 1 is 'switch' from here but GPU 1 says 'node'",
        ),
        ([fake_device(0, cpu_affinity="0-x")], "cpu_affinity"),
    ],
)
def test_a_fake_topology_that_contradicts_itself_is_refused(
    tmp_path: Path, devices: list[dict[str, object]], words: str
) -> None:
    raw = write_fake_nvml(tmp_path / "gpus.json", devices).read_bytes()
    with pytest.raises(FakeFileError, match=words):
        parse_fake_file(raw, "gpus.json")


def test_links_word_a_set_by_the_closest_level_all_of_it_shares() -> None:
    gpus = [
        GpuInfo(index=0, numa_node=0, pcie_levels=(None, "switch", "node", "system")),
        GpuInfo(index=1, numa_node=0, pcie_levels=("switch", None, "node", "system")),
        GpuInfo(index=2, numa_node=0, pcie_levels=("node", "node", None, "system")),
        GpuInfo(index=3, numa_node=1, pcie_levels=("system", "system", "system", None)),
    ]
    links = Links.of(gpus)
    assert links.describe((0, 1)) == "same PCIe switch"
    assert links.describe((0, 1, 2)) == "same NUMA node 0"
    assert links.describe((2, 3)) == "across NUMA nodes 0,1"
    assert links.crosses_sockets((2, 3)) and not links.crosses_sockets((0, 2))
    assert Links.of(None).describe((0, 1)) == "no topology known"
