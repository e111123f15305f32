"""The planner of one host's ``set``: the time limit it writes into the assignment."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.errors import RequestError
from allocator.placement.choose import Request
from allocator.store import Store

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)
LIMITED = EXAMPLE.replace(
    "    sharing: exclusive         # one job per GPU (the default)\n",
    "    sharing: exclusive\n    default_time: 1h\n    max_time: 4h\n",
    1,
)


def _allocator(store: Store, policy: str = LIMITED) -> Allocator:
    allocator = Allocator(store, clock=lambda: NOW, actor="alice@h")
    allocator.apply_policy(policy, "p.yaml")
    return allocator


def test_the_pools_default_time_ends_a_job_that_asks_for_none(store: Store) -> None:
    assignment, _ = _allocator(store).assign(Request(job="train", host="node1", gpus=(0,)))

    assert assignment.ends_at == "2026-06-01T01:00:00Z"


def test_time_asked_within_the_maximum_is_written(store: Store) -> None:
    request = Request(job="train", host="node1", gpus=(0,), time="90m")

    assignment, _ = _allocator(store).assign(request)

    assert assignment.ends_at == "2026-06-01T01:30:00Z"


def test_time_above_the_maximum_is_refused_naming_the_pool_and_writes_nothing(
    store: Store,
) -> None:
    allocator = _allocator(store)

    with pytest.raises(RequestError, match="maximum of pool default: 4h") as refused:
        allocator.assign(Request(job="train", host="node1", gpus=(0,), time="5h"))

    assert refused.value.exit_code == 2
    assert allocator.find_job("train") == []


def test_a_host_without_pool_limits_has_no_end_unless_asked(store: Store) -> None:
    allocator = _allocator(store, EXAMPLE)

    plain, _ = allocator.assign(Request(job="a", host="node1", gpus=(0,)))
    limited, _ = allocator.assign(Request(job="b", host="node1", gpus=(1,), time="2s"))

    assert plain.ends_at == ""
    assert limited.ends_at == "2026-06-01T00:00:02Z"


def test_a_new_set_without_time_keeps_the_jobs_end(store: Store) -> None:
    allocator = _allocator(store)
    allocator.assign(Request(job="train", host="node1", gpus=(0,), time="2h"))

    moved, _ = allocator.assign(Request(job="train", host="node1", gpus=(1,)))

    assert moved.ends_at == "2026-06-01T02:00:00Z"
