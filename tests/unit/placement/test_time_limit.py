"""The time-limit decisions every job path shares: the limit, the end time, whether it has come."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from allocator.errors import EXIT_INVALID, RequestError
from allocator.placement.time_limit import (
    end_time,
    limit_reached,
    resolve_limit,
    seconds_left,
    time_left_text,
)

START = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_request_without_time_gets_the_pool_default() -> None:
    assert resolve_limit(None, "a100", 4 * 3600.0, 24 * 3600.0) == 4 * 3600.0


def test_no_request_and_no_default_means_no_limit() -> None:
    assert resolve_limit(None, "a100", None, 24 * 3600.0) is None


def test_a_request_within_the_maximum_is_kept() -> None:
    assert resolve_limit("1h30m", "a100", 4 * 3600.0, 24 * 3600.0) == 5400.0


def test_a_request_above_the_maximum_is_refused_naming_it() -> None:
    with pytest.raises(RequestError) as caught:
        resolve_limit("13h", "a100", None, 12 * 3600.0)
    assert caught.value.exit_code == EXIT_INVALID
    assert "12h" in str(caught.value) and "a100" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["2", "soon", "0s"])
def test_a_bad_time_is_refused(text: str) -> None:
    with pytest.raises(RequestError):
        resolve_limit(text, "a100", None, None)


def test_the_end_time_is_absolute_and_empty_without_a_limit() -> None:
    assert end_time(START, 2.0) == "2026-01-02T03:04:07Z"
    assert end_time(START, None) == ""


def test_the_end_is_rounded_up_to_the_second_so_no_time_is_lost() -> None:
    assert end_time(START + timedelta(milliseconds=300), 2.0) == "2026-01-02T03:04:08Z"
    assert end_time(START, 1.5) == "2026-01-02T03:04:07Z"


def test_the_deadline_reached_means_stop() -> None:
    end = end_time(START, 2.0)
    assert not limit_reached(end, START + timedelta(seconds=1))
    assert limit_reached(end, START + timedelta(seconds=2))
    assert limit_reached(end, START + timedelta(hours=1))


def test_seconds_left_drives_the_timer() -> None:
    end = end_time(START, 60.0)
    assert seconds_left(end, START) == 60.0
    assert seconds_left(end, START + timedelta(minutes=5)) == 0.0


def test_no_end_never_stops() -> None:
    assert seconds_left("", START) is None
    assert not limit_reached("", START + timedelta(days=365))
    assert not limit_reached("garbage", START)


def test_the_time_left_is_shown_short_and_empty_without_a_limit() -> None:
    end = end_time(START, 5400.0)
    assert time_left_text(end, START) == "1h30m"
    assert time_left_text(end, START + timedelta(hours=2)) == "0s"
    assert time_left_text("", START) == ""
