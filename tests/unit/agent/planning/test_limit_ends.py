"""The agent's time-limit timer: which assignments it releases, and when it wakes next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from allocator.agent.planning.limit_ends import limit_releases, next_limit_in
from allocator.agent.planning.types import IdleRelease
from allocator.records.types import Assignment, RunHolder

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _held(job: str, ends_at: str = "", run: RunHolder | None = None) -> Assignment:
    return Assignment(
        job=job,
        host="node1",
        gpus=(0,),
        mode="gpu",
        updated_by="alice@h",
        updated_at="2026-06-01T11:00:00Z",
        ends_at=ends_at,
        run=run,
    )


def test_a_job_past_its_end_is_released_with_reason_time_limit() -> None:
    held = {"train": _held("train", "2026-06-01T12:00:00Z")}

    releases = limit_releases(held, {"train": 7}, NOW)

    assert releases == [IdleRelease("train", 7, "time limit", kind="time-limit")]


def test_a_job_before_its_end_or_without_one_is_left() -> None:
    held = {"soon": _held("soon", "2026-06-01T12:00:01Z"), "free": _held("free")}

    assert limit_releases(held, {"soon": 1, "free": 2}, NOW) == []


def test_a_processs_holding_is_left_to_its_process() -> None:
    held = {"run": _held("run", "2026-06-01T11:00:00Z", RunHolder(pid=42))}

    assert limit_releases(held, {"run": 1}, NOW) == []
    assert next_limit_in(held, NOW - timedelta(hours=2)) is None


def test_the_loop_wakes_at_the_earliest_end_to_come() -> None:
    held = {
        "a": _held("a", "2026-06-01T12:00:30Z"),
        "b": _held("b", "2026-06-01T12:00:05Z"),
        "gone": _held("gone", "2026-06-01T11:00:00Z"),
    }

    assert next_limit_in(held, NOW) == 5.0
    assert next_limit_in({}, NOW) is None
