"""Retry timing: capped, jittered backoff, forgiven only after a healthy period."""

from __future__ import annotations

import random

from allocator.util.retry_timer import RetryTimer


def test_retry_delays_grow_are_jittered_and_capped() -> None:
    random.seed(1234)  # tenacity draws the jitter from `random`: make the draw repeatable
    timer = RetryTimer(cap_seconds=4.0, base_seconds=0.5)
    delays = [timer.failed(100.0) - 100.0 for _ in range(200)]
    assert all(0.0 <= d <= 4.0 for d in delays)
    assert (
        max(delays[:2]) <= 2.0 < max(delays[100:])
    )  # early retries are quick, later ones back off
    assert len(set(delays)) > 1  # with jitter, agents do not retry in lock-step


def test_backoff_is_not_forgiven_by_a_connect_that_fails_again_soon() -> None:
    random.seed(99)
    timer = RetryTimer(cap_seconds=8.0, base_seconds=0.5)
    now = 0.0
    for _ in range(6):  # connects, then fails a moment later, again and again
        now = timer.failed(now)
        timer.connected(now)
        now += 0.1
    assert timer.failures == 6
    assert timer.failed(now) - now <= 8.0


def test_backoff_is_forgiven_after_a_healthy_period() -> None:
    timer = RetryTimer(cap_seconds=8.0, base_seconds=0.5)
    for _ in range(5):
        timer.failed(0.0)
    timer.connected(100.0)
    timer.failed(100.0 + 8.0)  # up for the whole healthy period: a fresh outage
    assert timer.failures == 1


def test_a_refused_permission_is_retried_at_the_cap() -> None:
    timer = RetryTimer(cap_seconds=30.0)
    assert timer.failed_slowly(10.0) == 40.0
