"""How often the agent's loop looks while a stop or start is under way."""

from __future__ import annotations

import pytest

from allocator.agent.daemon import BUSY_TICK_SECONDS, FIRST_BUSY_TICK_SECONDS, busy_tick


@pytest.mark.parametrize(
    ("busy_for", "tick"),
    [(0.0, 0.001), (0.005, 0.001), (0.02, 0.002), (0.05, 0.005), (30.0, 0.005)],
)
def test_a_stop_is_watched_every_millisecond_at_first_then_every_five(
    busy_for: float, tick: float
) -> None:
    assert busy_tick(busy_for) == pytest.approx(tick)
    assert FIRST_BUSY_TICK_SECONDS <= busy_tick(busy_for) <= BUSY_TICK_SECONDS
