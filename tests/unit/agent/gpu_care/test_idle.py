"""Idle holders (pure, fake clock): when a job's GPUs count as idle, and what the rules do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from allocator.agent.gpu_care.idle import (
    PUBLISH_AFTER_SECONDS,
    IdleRelease,
    IdleTracker,
    idle_actions,
)
from allocator.gpus.usage import GpuUsage
from allocator.policy.model import IdleRule

START = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)


def _usage(*percents: int | None, error_on: int | None = None) -> tuple[GpuUsage, ...]:
    return tuple(
        GpuUsage(index=i, error="GPU is lost") if i == error_on else GpuUsage(i, p)
        for i, p in enumerate(percents)
    )


class Clock:
    """Monotonic seconds and the same moment on the wall."""

    def __init__(self) -> None:
        self.now = 100.0

    def wall(self) -> datetime:
        return START + timedelta(seconds=self.now - 100.0)


def test_a_job_is_idle_from_the_first_sample_where_all_its_gpus_were_under_the_threshold() -> None:
    tracker, clock = IdleTracker(), Clock()
    jobs = {"train": (0, 1)}
    tracker.update(jobs, _usage(3, 60), {}, clock.now, clock.wall())
    assert tracker.idle_seconds(clock.now) == {}  # one GPU busy: the job is busy
    clock.now += 5
    tracker.update(jobs, _usage(3, 4), {}, clock.now, clock.wall())
    clock.now += 3600
    tracker.update(jobs, _usage(0, 0), {}, clock.now, clock.wall())
    assert tracker.idle_seconds(clock.now) == {"train": 3600.0}
    assert tracker.published(clock.now) == {"train": "2027-01-01T12:00:05Z"}


def test_one_busy_sample_ends_the_spell() -> None:
    tracker, clock = IdleTracker(), Clock()
    tracker.update({"train": (0,)}, _usage(0), {}, clock.now, clock.wall())
    clock.now += 600
    tracker.update({"train": (0,)}, _usage(90), {}, clock.now, clock.wall())
    assert tracker.idle_seconds(clock.now) == {}
    clock.now += 5
    tracker.update({"train": (0,)}, _usage(0), {}, clock.now, clock.wall())
    assert tracker.idle_seconds(clock.now + 1) == {"train": 1.0}  # a new spell


def test_what_cannot_be_measured_is_never_idle() -> None:
    tracker, clock = IdleTracker(), Clock()
    tracker.update({"a": (0,), "b": (1,), "c": (2,)}, _usage(None, 0, 0, error_on=2), {}, 1, START)
    assert set(tracker.idle_seconds(2)) == {"b"}
    tracker.update({"b": (1,)}, None, {}, clock.now, clock.wall())  # no sample at all
    assert tracker.idle_seconds(clock.now) == {}


def test_the_threshold_is_the_jobs_own() -> None:
    tracker = IdleTracker()
    tracker.update({"a": (0,), "b": (0,)}, _usage(8), {"a": 10.0}, 1, START)
    assert set(tracker.idle_seconds(2)) == {"a"}  # 8% is under a's 10%, not the default 5%


def test_idle_since_is_published_only_after_a_while_so_short_pauses_write_nothing() -> None:
    tracker = IdleTracker()
    tracker.update({"a": (0,), "b": (1,)}, _usage(0, 0), {}, 0.0, START)
    assert tracker.published(PUBLISH_AFTER_SECONDS - 1) == {}
    assert tracker.published(PUBLISH_AFTER_SECONDS - 1, {"b": 10.0}) == {
        "b": "2027-01-01T12:00:00Z"
    }
    assert set(tracker.published(PUBLISH_AFTER_SECONDS)) == {"a", "b"}


RULES = {
    "train": (IdleRule(after_seconds=7200.0, action="release"), "pool a100"),
    "notebook": (IdleRule(after_seconds=1800.0, action="warn"), "job notebook"),
}


def test_a_release_rule_asks_to_release_the_judged_assignment_with_its_reason() -> None:
    warned: set[str] = set()
    early = idle_actions({"train": 7199.0}, RULES, {"train": 42}, warned)
    assert early.release == ()
    due = idle_actions({"train": 7380.0}, RULES, {"train": 42}, warned)
    assert due.release == (
        IdleRelease("train", 42, "idle for 2h03m (policy idle rule on pool a100)"),
    )


def test_a_warn_rule_warns_once_per_idle_spell() -> None:
    warned: set[str] = set()
    first = idle_actions({"notebook": 1800.0}, RULES, {"notebook": 7}, warned)
    assert first.warn == (("notebook", "idle for 30m00s (policy idle rule on job notebook)"),)
    assert first.release == ()
    assert idle_actions({"notebook": 1900.0}, RULES, {"notebook": 7}, warned).warn == ()
    idle_actions({}, RULES, {"notebook": 7}, warned)  # busy again: the spell ended
    assert idle_actions({"notebook": 1800.0}, RULES, {"notebook": 7}, warned).warn != ()


def test_jobs_without_a_rule_are_only_shown() -> None:
    actions = idle_actions({"other": 10**6}, RULES, {"other": 1}, set())
    assert actions.warn == () and actions.release == ()
