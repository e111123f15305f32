"""A pool's time limits: ``default_time`` and ``max_time``, read as seconds and checked."""

from __future__ import annotations

import textwrap

import pytest

from allocator.errors import EXIT_INVALID, PolicyError
from allocator.policy import load_policy


def _policy(pool_fields: str) -> str:
    return textwrap.dedent(
        f"""\
        version: 1
        hosts:
          node1: {{gpus: 2}}
        pools:
          a100: {{hosts: [node1], {pool_fields}}}
        """
    )


def test_the_pool_time_limits_are_read_as_seconds() -> None:
    policy = load_policy(_policy("default_time: 4h, max_time: 24h"))
    pool = policy.pools["a100"]
    assert pool.default_time == 4 * 3600.0
    assert pool.max_time == 24 * 3600.0


def test_a_pool_without_time_limits_has_none() -> None:
    pool = load_policy(_policy("max_gpus_per_job: 1")).pools["a100"]
    assert pool.default_time is None and pool.max_time is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ("default_time: 4", "unit"),
        ("max_time: soon", "duration"),
        ("default_time: 0s", "at least"),
        ("default_time: 2d, max_time: 1d", "above max_time 1d"),
    ],
)
def test_a_bad_time_limit_is_refused_in_one_line(fields: str, words: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(_policy(fields))
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_INVALID
    assert words in message
    assert "time" in message
    assert len(message.strip().splitlines()) == 1
