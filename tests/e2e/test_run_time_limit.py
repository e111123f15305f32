"""``allocator run time=``: the command's tree ends at its limit, and the GPUs go with it.

A command that ignores SIGTERM is killed after ``grace=``; history says
``time limit``; a bad limit is one line, exit 2, and nothing is held.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Cli

HELD = ("host=node1", "count=1")


@pytest.mark.slow
def test_a_command_ignoring_sigterm_ends_at_its_time_limit(applied: Cli) -> None:
    script = 'trap "" TERM; sleep 60 & wait; wait'
    result = applied("run", "job=timed", *HELD, "time=2s", "grace=1s", "--", "sh", "-c", script)
    assert result.code != 0, result.err
    assert applied("get", "job=timed").code == 6
    assert "time limit" in applied("history", "job=timed").out


def test_a_bad_time_is_one_line_and_exit_2_with_nothing_held(applied: Cli) -> None:
    for limit in ("time=soon", "time=0s", "time=2"):
        result = applied("run", "job=timeless", *HELD, limit, "--", "true")
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
        assert "time=" in result.err and "Traceback" not in result.err
    assert applied("get", "job=timeless").code == 6
