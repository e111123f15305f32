"""Durations as people write them: parsed strictly, printed back exactly or briefly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.util.durations import duration_text, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("7d", 604800), ("1.5s", 1.5)],
)
def test_durations_with_units_are_read_in_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2", "7200", "h", "", "2 h", "-1s", "2w", "2h2h", "30m1h"])
def test_anything_without_a_clear_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|unit"):
        parse_duration(text)


def test_a_bare_number_is_told_to_add_a_unit() -> None:
    with pytest.raises(ValueError, match="add a unit"):
        parse_duration("2")


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_exact_text_reads_back_as_the_same_seconds(seconds: int) -> None:
    assert parse_duration(duration_text(seconds)) == seconds


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(45, "45s"), (725, "12m05s"), (7380, "2h03m"), (273600, "3d04h"), (0.9, "0s")],
)
def test_short_form_keeps_the_two_largest_units(seconds: float, shown: str) -> None:
    assert format_duration(seconds) == shown
