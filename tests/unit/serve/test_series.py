"""The series ``allocator serve`` samples: one sample per interval, at most so many, by column."""

from __future__ import annotations

from collections.abc import Callable

from allocator.serve.series import Sample, Series


def _take(held: int, queue: int) -> Callable[[float], Sample]:
    def take(now: float) -> Sample:
        pools = {"a100": {"held": held, "idle": 0, "free": 8 - held, "unhealthy": 0}}
        return Sample(now, pools, dict(pools["a100"]), None, queue)

    return take


def test_a_sample_is_taken_once_per_interval_and_the_oldest_go_first() -> None:
    series = Series(interval=10.0, points=3)
    clock = 1000.0
    taken = []
    for step in range(12):  # every 5 s for a minute: a sample every other step
        taken.append(series.tick(clock, _take(step, step % 2)))
        clock += 5.0
    assert taken == [True, False] * 6
    assert series.due_in(clock - 5.0) == 5.0 and series.due_in(clock) == 0.0
    document = series.document()
    assert document["interval_seconds"] == 10.0
    assert document["t"] == [1030.0, 1040.0, 1050.0]  # the last three of six
    assert document["pools"]["a100"]["held"] == [6, 8, 10]
    assert document["pools"]["a100"]["free"] == [2, 0, -2]
    assert document["total"]["held"] == [6, 8, 10]
    assert document["queue"] == [0, 0, 0]
    assert document["utilisation_percent"] == [None, None, None]


def test_a_pool_absent_at_a_sample_is_null_there() -> None:
    series = Series(interval=1.0, points=10)
    series.tick(0.0, lambda now: Sample(now, {}, {"held": 0}, None, 0))
    series.tick(1.0, _take(2, 1))
    document = series.document()
    assert document["pools"]["a100"]["held"] == [None, 2]
    assert document["total"]["held"] == [0, 2] and document["total"]["idle"] == [0, 0]
    assert document["queue"] == [0, 1]
