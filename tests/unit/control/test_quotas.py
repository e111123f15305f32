"""Quota counters (pure): what a change charges, and the refusal that names the quota."""

from __future__ import annotations

import textwrap

import pytest

from allocator.control.quotas import OverQuota, counter_key, plan_charge, quota_refusal
from allocator.errors import EXIT_CONFLICT
from allocator.policy import load_policy
from allocator.policy.model import Policy
from allocator.records.holders import Charge, HolderCount
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import KeyValue, Put

LAYOUT = KeyLayout()


def _policy() -> Policy:
    text = """
    version: 1
    hosts:
      node1: {gpus: 8}
      node2: {gpus: 4}
    pools:
      big: {hosts: [node1]}
      shared: {hosts: [node2], sharing: {mode: time-slice, slots: 4}}
    teams:
      team-a: {members: [alice]}
    quotas:
      - {who: team:team-a, gpus: 4, slots: 3}
      - {who: user:alice, gpus: 2, pools: [big]}
    """
    return load_policy(textwrap.dedent(text).lstrip("\n"), "policy.yaml")


def _held(job: str, host: str, gpus: tuple[int, ...], slots: int = 1) -> Assignment:
    return Assignment(
        job=job, host=host, gpus=gpus, mode="gpu", updated_by="t", updated_at="t",
        slots=slots, holder="alice", charged=("team:team-a", "user:alice"),
    )  # fmt: skip


def _holding(name: str, gpus: int) -> HolderCount:
    return HolderCount(charges={name: Charge("big", gpus=gpus)})


def test_vanished_charges_are_dropped_and_the_quota_judged_without_them() -> None:
    counters = {"user:alice": _counter(_holding("node1/gone", 2), 7)}
    found = plan_charge(
        _policy(), LAYOUT, counters, [], [_held("b", "node1", (2,))], gone={"node1/gone"}
    )
    alice = HolderCount.from_json(found.ops[1].value)  # type: ignore[union-attr]
    assert alice.charges == {"node1/b": Charge("big", gpus=1)}


def _counter(value: HolderCount, revision: int) -> KeyValue:
    return KeyValue("k", value.to_json(), revision, revision)


def test_a_set_charges_each_subject_and_compares_its_counter() -> None:
    found = plan_charge(_policy(), LAYOUT, {}, [], [_held("a", "node1", (0, 1))])
    keys = [c.key for c in found.compares]
    assert keys == [counter_key(LAYOUT, "team:team-a"), counter_key(LAYOUT, "user:alice")]
    assert [c.mod_revision for c in found.compares] == [0, 0]  # absent: must stay absent
    written = [HolderCount.from_json(op.value) for op in found.ops if isinstance(op, Put)]
    assert written == [HolderCount(charges={"node1/a": Charge("big", gpus=2)})] * 2
    assert written[0].totals() == ({"big": 2}, {})


def test_shared_gpus_count_slots_not_gpus() -> None:
    found = plan_charge(_policy(), LAYOUT, {}, [], [_held("s", "node2", (0, 1), slots=1)])
    team = HolderCount.from_json(found.ops[0].value)  # type: ignore[union-attr]
    assert team.totals() == ({}, {"shared": 2})


def test_over_a_quota_is_refused_naming_it_with_held_and_limit() -> None:
    counters = {"user:alice": _counter(_holding("node1/a", 2), 7)}
    with pytest.raises(OverQuota) as info:
        plan_charge(_policy(), LAYOUT, counters, [], [_held("b", "node1", (2,))])
    assert str(info.value) == "over quota alice in pools big 2/2 GPUs (this asks 1 more)"
    assert info.value.exit_code == EXIT_CONFLICT


def test_a_release_gives_back_and_a_move_within_the_quota_passes() -> None:
    held = _held("a", "node1", (0, 1))
    counters = {
        "user:alice": _counter(_holding("node1/a", 2), 7),
        "team:team-a": _counter(_holding("node1/a", 2), 8),
    }
    released = plan_charge(_policy(), LAYOUT, counters, [held], [])
    assert [c.mod_revision for c in released.compares] == [8, 7]
    assert all(HolderCount.from_json(op.value) == HolderCount() for op in released.ops)  # type: ignore[union-attr]
    moved = plan_charge(_policy(), LAYOUT, counters, [held], [_held("a", "node1", (4, 5))])
    assert moved.compares == [] and moved.ops == []  # same pool, same count: nothing to write


def test_a_damaged_counter_charges_nothing_more_and_a_release_leaves_it() -> None:
    counters = {"user:alice": KeyValue("k", b"garbage", 3, 3)}
    with pytest.raises(OverQuota, match="quota counter of user:alice is damaged"):
        plan_charge(_policy(), LAYOUT, counters, [], [_held("a", "node1", (0,))])
    why = quota_refusal(_policy(), ["user:alice"], counters, "big", (1, 0))
    assert why is not None and "damaged" in why
    bad: list[object] = []
    found = plan_charge(_policy(), LAYOUT, counters, [_held("a", "node1", (0,))], [], bad.append)
    assert len(bad) == 1 and found.ops == []  # reported; the release goes on, the counter stays


def test_quota_refusal_says_why_a_waiting_request_is_over() -> None:
    counters = {"team:team-a": _counter(_holding("node1/x", 4), 2)}
    why = quota_refusal(_policy(), ["team:team-a"], counters, "big", (1, 0))
    assert why == "over quota team-a 4/4 GPUs"
    assert quota_refusal(_policy(), ["team:team-a"], {}, "big", (1, 0)) is None
