"""The queue's order and turn rule (pure)."""

from __future__ import annotations

from allocator.control.queue_order import Waiting, blockers, could_use, in_order
from allocator.records.holders import QueueEntry


def _waiting(name: str, arrived: int, *, priority: int = 0, **ask: object) -> Waiting:
    entry = QueueEntry(job=name, host="node1", holder="u", since="t", priority=priority, **ask)  # type: ignore[arg-type]
    return Waiting(f"/q/{name}", entry, arrived, arrived)


def test_higher_priority_first_then_first_come_first_served() -> None:
    late, early = _waiting("late", 9, count=1), _waiting("early", 3, count=1)
    order = in_order([late, early, _waiting("vip", 12, priority=5, count=1)])
    assert [w.entry.job for w in order] == ["vip", "early", "late"]


def test_a_request_for_other_gpus_or_one_that_cannot_fit_blocks_no_one() -> None:
    assert not could_use(_waiting("x", 1, gpus=(2, 3)).entry, [0, 1], usable=8)
    assert could_use(_waiting("x", 1, gpus=(1, 3)).entry, [0, 1], usable=8)
    assert could_use(_waiting("x", 1, count=8).entry, [0], usable=8)
    assert not could_use(_waiting("x", 1, count=9).entry, [0], usable=8)  # can never fit


def test_small_requests_wait_behind_an_older_large_one_that_could_use_their_gpus() -> None:
    order = in_order([_waiting("large", 1, count=4), _waiting("small", 2, count=1)])
    assert [w.entry.job for w in blockers(order, "/q/small", [0], usable=4)] == ["large"]
    assert blockers(order, "/q/large", [0, 1, 2, 3], usable=4) == []


def test_an_entry_over_quota_is_skipped() -> None:
    order = in_order([_waiting("greedy", 1, count=1), _waiting("next", 2, count=1)])
    skipped = blockers(
        order, "/q/next", [0], usable=4, over_quota=lambda w: w.entry.job == "greedy"
    )
    assert skipped == []
