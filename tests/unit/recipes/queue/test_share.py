"""Fair share: decayed usage, the factor, and the order it gives equal priorities (pure)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from allocator.control.client import Allocator
from allocator.history.rollup import Row, rollup_ops
from allocator.policy.loader import load_policy
from allocator.policy.model import FairShare
from allocator.recipes.queue.order import Waiting, in_order
from allocator.recipes.queue.share import (
    decayed_hours,
    read_share,
    share_of,
    usage_by_holder,
)
from allocator.records.holders import QueueEntry
from allocator.store import open_store

DAY = 86_400.0
WEEK = 7 * DAY
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)

POLICY = """\
version: 1
hosts:
  node1: {gpus: 4}
teams:
  vision: {members: [alice, bob]}
fair_share: {half_life: 7d, halve_at: 10, team_weight: %s}
"""


def test_an_hour_held_a_half_life_ago_counts_half_of_one_held_now() -> None:
    now = NOW.timestamp()
    recent = decayed_hours(1, now - 60, now, now, WEEK)
    old = decayed_hours(1, now - WEEK - 60, now - WEEK, now, WEEK)
    assert recent == pytest.approx(60 / 3600, rel=1e-4)
    assert old == pytest.approx(recent / 2, rel=1e-4)


def test_gpus_multiply_and_a_long_holding_converges_to_half_life_over_ln2() -> None:
    now = NOW.timestamp()
    assert decayed_hours(4, now - 3600, now, now, WEEK) == pytest.approx(
        4 * decayed_hours(1, now - 3600, now, now, WEEK)
    )
    forever = decayed_hours(1, now - 100 * WEEK, now, now, WEEK)
    assert forever == pytest.approx(WEEK / math.log(2) / 3600, rel=1e-6)


def test_a_holding_ending_after_now_counts_only_up_to_now() -> None:
    now = NOW.timestamp()
    assert decayed_hours(1, now - 60, now + 3600, now, WEEK) == decayed_hours(
        1, now - 60, now, now, WEEK
    )
    assert decayed_hours(1, now + 10, now + 20, now, WEEK) == 0.0


def test_usage_is_summed_per_holder() -> None:
    now = NOW.timestamp()
    rows: list[Row] = [
        ("node1", "a", "alice", 1, 1, now - 3600, now),
        ("node1", "b", "alice", 1, 1, now - 3600, now),
        ("node1", "c", "bob", 2, 1, now - 3600, now),
    ]
    usage = usage_by_holder(rows, now, WEEK)
    assert usage["alice"] == pytest.approx(usage["bob"])
    assert set(usage) == {"alice", "bob"}


def test_the_factor_halves_at_halve_at_and_teams_add_their_weighted_usage() -> None:
    policy = load_policy(POLICY % 0.5)
    alone = FairShare(half_life_seconds=WEEK, halve_at=10)
    assert share_of(policy, alone, "alice", {}).factor == 1.0
    assert share_of(policy, alone, "alice", {"alice": 10}).factor == 0.5
    assert share_of(policy, alone, "alice", {"alice": 20}).factor == 0.25
    assert share_of(policy, alone, "alice", {"bob": 20}).factor == 1.0  # team_weight 0
    teamed = FairShare(half_life_seconds=WEEK, halve_at=10, team_weight=0.5)
    share = share_of(policy, teamed, "alice", {"bob": 20})  # the team used 20: 10 is alice's
    assert (share.usage, share.factor) == (10.0, 0.5)
    assert share_of(policy, teamed, "carol", {"bob": 20}).factor == 1.0  # in no team


def _waiting(name: str, arrived: int, priority: int = 0, share: float | None = None) -> Waiting:
    entry = QueueEntry(
        job=name, host="node1", holder=name, since="t", count=1, priority=priority, fair_share=share
    )
    return Waiting(f"/q/{name}", entry, arrived, arrived)


def test_equal_priorities_go_by_factor_then_first_come() -> None:
    order = in_order(
        [
            _waiting("heavy", 1, share=0.25),
            _waiting("light", 2, share=0.9),
            _waiting("vip", 3, priority=5, share=0.01),
            _waiting("light-too", 4, share=0.9),
        ]
    )
    assert [w.entry.job for w in order] == ["vip", "light", "light-too", "heavy"]


def test_without_fair_share_the_order_is_priority_then_first_come() -> None:
    order = in_order([_waiting("b", 2), _waiting("a", 1), _waiting("vip", 3, priority=1)])
    assert [w.entry.job for w in order] == ["vip", "a", "b"]


def _client(policy: str) -> Allocator:
    client = Allocator(open_store(f"memory://{uuid.uuid4().hex}"), clock=lambda: NOW)
    client.apply_policy(policy, "policy.yaml")
    return client


def _seed(client: Allocator, holder: str, hours: float, ended_ago: timedelta, n: int) -> None:
    end = (NOW - ended_ago).timestamp()
    row: Row = ("node1", f"job{n}", holder, 1, 1, end - hours * 3600, end)
    history = client.layout.history
    client.store.txn([], rollup_ops(history, f"{history}hosts/node1/{n:08d}", [row]))


def test_read_share_reads_the_rollup_of_four_half_lives() -> None:
    client = _client(POLICY.replace("half_life: 7d", "half_life: 30d") % 0)
    _seed(client, "alice", 10, timedelta(days=1), 1)
    _seed(client, "alice", 10, timedelta(days=100), 2)  # past the first 64 days read
    _seed(client, "alice", 1000, timedelta(days=130), 3)  # past four half-lives: not read
    policy = client.require_policy().policy
    share = read_share(client, policy, "alice")
    assert share is not None
    recent = decayed_hours(1, 0, 36_000, 36_000 + DAY, 30 * DAY)
    older = decayed_hours(1, 0, 36_000, 36_000 + 100 * DAY, 30 * DAY)
    assert share.usage == pytest.approx(recent + older, abs=1e-3)
    assert read_share(client, policy, "bob") == share_of(policy, policy.fair_share, "bob", {})  # type: ignore[arg-type]


def test_no_fair_share_in_the_policy_reads_nothing() -> None:
    client = _client("version: 1\nhosts:\n  node1: {gpus: 1}\n")
    assert read_share(client, client.require_policy().policy, "alice") is None


def test_a_submitted_jobs_entry_gets_its_submitters_share_at_joining() -> None:
    from allocator.placement.request import Request
    from allocator.recipes.submit.enqueue import BatchJob, submit

    client = _client(POLICY % 0)
    _seed(client, "alice", 10, timedelta(days=1), 1)
    alice = Allocator(client.store, holder="alice", clock=lambda: NOW)
    batch = BatchJob(Request(job="batch", host="node1", count=1), ("true",), "/")
    assert submit(alice, batch) == ["batch"]
    listing = client.store.list(client.layout.host_queue("node1"))
    (entry,) = [QueueEntry.from_json(item.value) for item in listing.items]
    share = read_share(client, client.require_policy().policy, "alice")
    assert share is not None and share.factor < 1.0
    assert (entry.fair_share, entry.usage) == (share.factor, share.usage)
