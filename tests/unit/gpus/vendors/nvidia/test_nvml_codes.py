"""NVML's topology codes against the level names the agent publishes."""

from __future__ import annotations

from allocator.gpus.vendors.nvidia.nvml_codes import level_from_nvml, nvml_code
from allocator.records.fields import PCIE_LEVELS


def test_every_level_round_trips_through_nvml_s_code() -> None:
    assert [level_from_nvml(nvml_code(level)) for level in PCIE_LEVELS] == list(PCIE_LEVELS)
    assert (nvml_code("board"), nvml_code("system")) == (0, 50)


def test_a_code_nvml_never_returns_has_no_level() -> None:
    assert level_from_nvml(25) is None
