"""Vendor-neutral health: the verdict records, and which vendors give the agent a monitor."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.gpus.health import DEFAULT_IGNORED_XIDS, GpuHealth, HealthMonitor, HealthState
from allocator.gpus.vendors.registry import VENDORS, vendor_named
from allocator.policy.model import HealthSettings
from tests.support.fake_gpus import FakeGpus


def test_a_recovering_gpu_says_how_many_clean_checks_it_has() -> None:
    state = HealthState(
        (
            GpuHealth(0, True),
            GpuHealth(1, False, "XID 79", clean_checks=1),
            GpuHealth(2, False),
        ),
        checked_at=5.0,
        recover_after=3,
    )
    assert state.healthy_indices() == (0,)
    assert state.unhealthy() == {1: "XID 79 (recovering: 1/3 clean checks)", 2: "unhealthy"}
    recovering = state.get(1)
    assert recovering is not None and recovering.recovering
    assert state.get(7) is None


def test_a_counter_s_baseline_is_read_by_name() -> None:
    gpu = GpuHealth(0, True, baselines=(("ecc_volatile", 3),))
    assert (gpu.baseline("ecc_volatile"), gpu.baseline("rows_remapped")) == (3, None)


def test_the_policy_s_default_ignored_xids_are_the_monitor_s() -> None:
    assert HealthSettings().ignored_xids == DEFAULT_IGNORED_XIDS
    assert {13, 31, 43, 45, 68, 109} == DEFAULT_IGNORED_XIDS


def test_nvidia_gives_a_monitor_that_judges_its_signals(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 2)
    monitor: HealthMonitor | None = vendor_named("nvidia").health_monitor(gpus.environ)
    assert monitor is not None
    try:
        gpus.add_xid(1, 79)
        state = monitor.check(1.0)
        assert list(state.unhealthy()) == [1] and monitor.error is None
        assert monitor.state is state
    finally:
        monitor.close()


@pytest.mark.parametrize("name", ["amd", "intel", "apple"])
def test_a_vendor_without_health_signals_gives_no_monitor(name: str, tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "gpus.json", 2, vendor=name)
    vendor = VENDORS[name]
    assert vendor.health_monitor(gpus.environ) is None
    assert vendor.health_source == "inventory"


def test_a_vendor_gives_a_monitor_exactly_when_its_health_comes_from_signals() -> None:
    env = {"ALLOCATOR_NVML": "off"}
    for vendor in VENDORS.values():
        monitor = vendor.health_monitor(env)
        assert (monitor is not None) == (vendor.health_source == "signals"), vendor.name
        if monitor is not None:
            monitor.close()
