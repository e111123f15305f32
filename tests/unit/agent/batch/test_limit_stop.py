"""A submitted job's time limit: SIGTERM at its end, SIGKILL once after the grace."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta

from allocator.agent.batch.limit_stop import LimitStop

END = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_nothing_is_due_before_the_end_or_without_one() -> None:
    limited, unlimited = LimitStop("2026-06-01T12:00:00Z", grace=2.0), LimitStop("")

    assert limited.due(END - timedelta(seconds=1), 100.0) is None
    assert unlimited.due(END + timedelta(days=1), 100.0) is None
    assert not limited.reached


def test_sigterm_at_the_end_then_sigkill_once_after_the_grace() -> None:
    stop = LimitStop("2026-06-01T12:00:00Z", grace=2.0)

    assert stop.due(END, 100.0) is signal.SIGTERM
    assert stop.reached
    assert stop.due(END + timedelta(seconds=1), 101.0) is None
    assert stop.due(END + timedelta(seconds=2), 102.0) is signal.SIGKILL
    assert stop.due(END + timedelta(seconds=3), 103.0) is None
