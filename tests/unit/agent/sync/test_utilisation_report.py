"""The mean utilisation an agent reports: rounded, and changed at most once per interval."""

from __future__ import annotations

from allocator.agent.sync.utilisation_report import UtilisationReport, mean_utilisation
from allocator.gpus.usage import GpuUsage


def _usage(*percents: int | None) -> tuple[GpuUsage, ...]:
    return tuple(GpuUsage(i, utilization_percent=p) for i, p in enumerate(percents))


def test_the_mean_is_of_the_gpus_that_measure_one_rounded_to_ten_points() -> None:
    assert mean_utilisation(_usage(90, 100, None)) == 100  # 95 rounds to even: 100
    assert mean_utilisation(_usage(33, 40)) == 40
    assert mean_utilisation(_usage(3)) == 0
    assert mean_utilisation(_usage(None, None)) is None  # MIG: Not Supported
    assert mean_utilisation(None) is None  # no sample yet


def test_the_reported_value_changes_at_most_once_per_interval() -> None:
    report = UtilisationReport(interval=300)
    assert report.update(_usage(90), now=0) == 90  # the first sample is reported at once
    assert report.update(_usage(40), now=10) == 90  # too soon: a busy host's jitter
    assert report.update(_usage(90), now=20) == 90
    assert report.update(_usage(40), now=299) == 90
    assert report.update(_usage(40), now=300) == 40
    assert report.update(_usage(90), now=400) == 40
    assert report.update(_usage(40), now=500) == 40  # back where it was: no change to wait for
    assert report.update(_usage(None), now=700) is None


def test_an_interval_of_zero_reports_nothing() -> None:
    assert UtilisationReport(interval=0).update(_usage(90), now=0) is None
