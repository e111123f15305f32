"""GPU health: the pure evaluator, table-driven, and the reader over the fake NVML."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.gpus.health import DEFAULT_IGNORED_XIDS, GpuHealth, HealthState
from allocator.gpus.vendors.fake_file import default_uuid
from allocator.gpus.vendors.nvidia.health import NvmlHealthMonitor, check_health, signal_problems
from allocator.gpus.vendors.nvidia.signals import COUNTERS, GpuSignals
from tests.support.fake_gpus import FakeGpus

IGNORED = DEFAULT_IGNORED_XIDS


def run(
    reads: list[list[GpuSignals]], *, ignored: frozenset[int] = IGNORED, recover_after: int = 2
) -> list[HealthState]:
    """Feed successive reads to check_health, one second apart."""
    states: list[HealthState] = []
    previous: HealthState | None = None
    for second, signals in enumerate(reads):
        previous = check_health(
            signals, ignored, previous, float(second), recover_after=recover_after
        )
        states.append(previous)
    return states


def gpu0(state: HealthState) -> GpuHealth:
    health = state.get(0)
    assert health is not None
    return health


CLEAN = GpuSignals(0)
#: The fake reports row remapping (0 rows) for every GPU, so that is always a baseline.
ROWS = (("remapped_rows_uncorrectable", 0),)


@pytest.mark.parametrize(
    ("signals", "problem"),
    [
        (GpuSignals(0, xids=(79,)), "XID 79 (GPU has fallen off the bus)"),
        (GpuSignals(0, xids=(48,)), "XID 48"),
        (GpuSignals(0, xids=(13, 94)), "XID 94"),
        (GpuSignals(0, remap_failure=True), "row remapping failed"),
        (GpuSignals(0, remap_pending=True), "row remapping pending"),
        (GpuSignals(0, failure="GPU is lost"), "device error: GPU is lost"),
    ],
)
def test_each_signal_makes_a_gpu_unhealthy(signals: GpuSignals, problem: str) -> None:
    (state,) = run([[signals]])
    assert not gpu0(state).healthy
    assert problem in (gpu0(state).reason or "")
    assert problem in state.unhealthy()[0]


@pytest.mark.parametrize("xid", sorted(DEFAULT_IGNORED_XIDS))
def test_application_xids_are_ignored_by_default(xid: int) -> None:
    (state,) = run([[GpuSignals(0, xids=(xid,))]])
    assert gpu0(state).healthy and state.unhealthy() == {}


def test_ignored_xids_come_from_the_caller() -> None:
    (state,) = run([[GpuSignals(0, xids=(13,))]], ignored=frozenset())
    assert not gpu0(state).healthy


@pytest.mark.parametrize("counter", sorted(COUNTERS))
def test_each_counter_makes_a_gpu_unhealthy_when_it_rises(counter: str) -> None:
    states = run([[GpuSignals(0, **{counter: 0})], [GpuSignals(0, **{counter: 3})]])
    assert [gpu0(s).healthy for s in states] == [True, False]
    assert f"{COUNTERS[counter]}: 3 (was 0)" in states[1].unhealthy()[0]


@pytest.mark.parametrize("counter", sorted(COUNTERS))
def test_a_gpu_first_seen_with_old_errors_is_healthy(counter: str) -> None:
    # The baseline is the first read, not 0: a count from last week is no news,
    # and a restarted agent must not stop a healthy worker over it.
    states = run([[GpuSignals(0, **{counter: 7})]] * 3)
    assert [gpu0(s).healthy for s in states] == [True, True, True]
    assert gpu0(states[0]).baseline(counter) == 7


@pytest.mark.parametrize(
    ("counts", "healthy"),
    [
        ([0], [True]),
        ([None], [True]),
        ([2, 2, 2], [True, True, True]),
        # an increase is a new problem; the same count is not
        ([0, 0, 1, 1, 1, 1], [True, True, False, False, True, True]),
        # driver reload resets the volatile counter: the lower count is the new baseline
        ([0, 5, 5, 5, 1, 1], [True, False, False, True, True, True]),
        # an unsupported read keeps the old baseline
        ([3, None, None, 3], [True, True, True, True]),
        ([3, None, 4, 4, 4], [True, True, False, False, True]),
    ],
)
def test_ecc_counts_against_the_previous_check(
    counts: list[int | None], healthy: list[bool]
) -> None:
    states = run([[GpuSignals(0, ecc_uncorrected=c)] for c in counts])
    assert [gpu0(s).healthy for s in states] == healthy


def test_xid_is_one_shot_and_recovers_after_clean_checks() -> None:
    states = run([[CLEAN], [GpuSignals(0, xids=(79,))], [CLEAN], [CLEAN], [CLEAN]])
    assert [gpu0(s).healthy for s in states] == [True, False, False, True, True]
    assert gpu0(states[2]).recovering
    assert "recovering: 1/2" in states[2].unhealthy()[0]
    assert gpu0(states[2]).reason == gpu0(states[1]).reason  # the cause stays visible


def test_persistent_signal_keeps_gpu_unhealthy_until_it_clears() -> None:
    pending = GpuSignals(0, remap_pending=True)
    states = run([[pending]] * 4 + [[CLEAN], [CLEAN]])
    assert [gpu0(s).healthy for s in states] == [False] * 5 + [True]
    assert all(gpu0(s).clean_checks == 0 for s in states[:4])


def test_a_bad_signal_during_recovery_restarts_the_count() -> None:
    bad = GpuSignals(0, xids=(79,))
    states = run([[bad], [CLEAN], [bad], [CLEAN], [CLEAN]])
    assert [gpu0(s).healthy for s in states] == [False, False, False, False, True]


def test_recover_after_is_configurable() -> None:
    states = run([[GpuSignals(0, failure="lost")], [CLEAN], [CLEAN], [CLEAN]], recover_after=3)
    assert [gpu0(s).healthy for s in states] == [False, False, False, True]


def test_since_marks_entering_the_current_state() -> None:
    bad = GpuSignals(0, remap_failure=True)
    states = run([[CLEAN], [bad], [bad], [CLEAN], [CLEAN], [CLEAN]])
    assert [gpu0(s).since for s in states] == [0.0, 1.0, 1.0, 1.0, 4.0, 4.0]


def test_gpu_no_longer_reported_is_unhealthy() -> None:
    states = run([[GpuSignals(0), GpuSignals(1)], [GpuSignals(0)]])
    assert states[1].healthy_indices() == (0,)
    assert "no longer reported" in states[1].unhealthy()[1]


def test_recover_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="recover_after"):
        check_health([CLEAN], IGNORED, None, 0.0, recover_after=0)


def test_signal_problems_is_empty_for_clean_signals() -> None:
    assert signal_problems(GpuSignals(0, ecc_uncorrected=4), IGNORED, {"ecc_uncorrected": 4}) == []
    assert signal_problems(GpuSignals(0, ecc_uncorrected=4), IGNORED, {}) == []


def test_a_restored_state_keeps_its_baselines_and_verdicts() -> None:
    # What an agent restarted on the same boot resumes from (see NvmlHealthMonitor.resume).
    saved = HealthState(
        (GpuHealth(0, False, "XID 79", 5.0, 0, (("ecc_uncorrected", 2),), "GPU-a"),), 5.0
    )
    clean, more = GpuSignals(0, ecc_uncorrected=2), GpuSignals(0, ecc_uncorrected=3)
    assert not gpu0(check_health([clean], IGNORED, saved, 6.0)).healthy  # still recovering
    rose = gpu0(check_health([more], IGNORED, saved, 6.0))
    assert "uncorrected ECC errors: 3 (was 2)" in (rose.reason or "")


# --- the reader, over the fake NVML file -----------------------------------------


@pytest.fixture
def gpus(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path / "nvml.json", 2)


@pytest.fixture
def monitor(gpus: FakeGpus) -> Iterator[NvmlHealthMonitor]:
    with NvmlHealthMonitor(environ=gpus.environ) as health:
        assert health.error is None
        yield health


def test_reader_sees_file_edits_on_the_next_check(
    gpus: FakeGpus, monitor: NvmlHealthMonitor
) -> None:
    assert monitor.check(0.0).unhealthy() == {}
    gpus.update(1, remap_pending=True)
    assert list(monitor.check(1.0).unhealthy()) == [1]
    gpus.update(1, remap_pending=None)
    monitor.check(2.0)
    assert monitor.check(3.0).unhealthy() == {}


def test_reader_delivers_each_xid_once(gpus: FakeGpus, monitor: NvmlHealthMonitor) -> None:
    monitor.check(0.0)
    gpus.add_xid(0, 79)
    assert "XID 79" in monitor.check(1.0).unhealthy()[0]
    assert monitor.check(2.0).get(0) == GpuHealth(
        0, False, "XID 79 (GPU has fallen off the bus)", 1.0, 1, ROWS, default_uuid(0)
    )
    assert monitor.check(3.0).unhealthy() == {}  # returned to service, not unhealthy forever
    gpus.add_xid(0, 13)  # application XID: ignored
    assert monitor.check(4.0).unhealthy() == {}


def test_xids_already_in_the_file_are_delivered_on_the_first_check(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 1)
    gpus.add_xid(0, 95)
    with NvmlHealthMonitor(environ=gpus.environ) as monitor:
        assert "XID 95" in monitor.check(0.0).unhealthy()[0]


@pytest.mark.parametrize(
    ("before", "fields", "reason"),
    [
        ({"ecc_uncorrected": 0}, {"ecc_uncorrected": 1}, "uncorrected ECC errors: 1 (was 0)"),
        (
            {"ecc_uncorrected_aggregate": 4},
            {"ecc_uncorrected_aggregate": 5},
            "uncorrected ECC errors (lifetime): 5 (was 4)",
        ),
        (
            {},
            {"remapped_rows_uncorrectable": 1},
            "rows remapped after uncorrectable errors: 1 (was 0)",
        ),
        (
            {"retired_pages_double_bit": 0},
            {"retired_pages_double_bit": 2},
            "pages retired after double-bit ECC errors: 2 (was 0)",
        ),
        ({}, {"remap_failure": True}, "row remapping failed"),
        ({}, {"remap_pending": True}, "row remapping pending"),
        ({}, {"lost": True}, "GPU is lost"),
        ({}, {"healthy": False}, "Unknown Error"),
    ],
)
def test_reader_reports_each_signal_from_the_file(
    gpus: FakeGpus,
    monitor: NvmlHealthMonitor,
    before: dict[str, object],
    fields: dict[str, object],
    reason: str,
) -> None:
    gpus.update(0, **before)
    monitor.check(0.0)
    gpus.update(0, **fields)
    unhealthy = monitor.check(1.0).unhealthy()
    assert list(unhealthy) == [0]
    assert reason in unhealthy[0]


def test_a_gpu_read_with_old_error_counts_on_first_sight_is_healthy(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 1)
    gpus.update(0, ecc_uncorrected=12, ecc_uncorrected_aggregate=40, retired_pages_double_bit=3)
    with NvmlHealthMonitor(environ=gpus.environ) as monitor:
        assert monitor.check(0.0).unhealthy() == {}
        assert monitor.check(1.0).unhealthy() == {}


def test_nvml_failing_is_no_verdict_on_any_gpu(gpus: FakeGpus, monitor: NvmlHealthMonitor) -> None:
    gpus.update(1, xid_events=[79])
    before = monitor.check(0.0)
    assert list(before.unhealthy()) == [1]
    gpus.system["nvml_error"] = "unknown"
    gpus.save()
    assert monitor.check(1.0) == before  # the last judgement stands
    assert monitor.error is not None and "Unknown Error" in monitor.error
    assert monitor.check(1.5) == before  # not re-opened before its backoff (1 s)
    del gpus.system["nvml_error"]
    gpus.save()
    after = monitor.check(2.0)  # re-opened: reads again
    assert monitor.error is None and after.checked_at == 2.0


def test_a_broken_file_mid_run_is_no_verdict_and_names_the_file(
    gpus: FakeGpus, monitor: NvmlHealthMonitor
) -> None:
    monitor.check(0.0)
    gpus.path.write_text("{not json")
    assert monitor.check(1.0).unhealthy() == {}
    assert monitor.error is not None and str(gpus.path) in monitor.error
    gpus.save()
    assert monitor.check(2.0).unhealthy() == {} and monitor.error is None


def test_reopen_opens_nvml_at_once(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 2, init_error="driver_not_loaded")
    with NvmlHealthMonitor(environ=gpus.environ) as monitor:
        assert monitor.error is not None and "driver not loaded" in monitor.error
        assert monitor.check(0.0).gpus == ()
        del gpus.system["init_error"]
        gpus.save()
        monitor.reopen(0.1)  # SIGHUP: no waiting for the backoff
        assert monitor.error is None
        assert monitor.check(0.2).healthy_indices() == (0, 1)


def test_a_monitor_whose_nvml_failed_at_start_retries_with_backoff(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "nvml.json", 1, init_error="unknown")
    with NvmlHealthMonitor(environ=gpus.environ) as monitor:
        assert monitor.check(0.5).gpus == ()
        del gpus.system["init_error"]
        gpus.save()
        assert monitor.check(0.9).gpus == ()  # next try at 1.0
        assert monitor.check(1.0).healthy_indices() == (0,)


def test_monitor_without_nvml_reports_why_and_no_gpus() -> None:
    with NvmlHealthMonitor(environ={"ALLOCATOR_NVML": "off"}) as monitor:
        assert monitor.error is not None and "off" in monitor.error
        assert monitor.check(0.0).gpus == ()
