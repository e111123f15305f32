"""The queue's order and turn rule (pure)."""

from __future__ import annotations

from allocator.recipes.queue.order import (
    Waiting,
    blockers,
    could_use,
    decode_queue,
    in_order,
    wanted_ahead,
)
from allocator.records.holders import QueueEntry
from allocator.store import KeyValue

FOUR = frozenset(range(4))


def _waiting(
    name: str, arrived: int, *, priority: int = 0, leased: bool = True, **ask: object
) -> Waiting:
    entry = QueueEntry(job=name, host="node1", holder="u", since="t", priority=priority, **ask)  # type: ignore[arg-type]
    return Waiting(f"/q/{name}", entry, arrived, arrived, leased)


def _all(_entry: QueueEntry) -> frozenset[int]:
    return FOUR


def test_higher_priority_first_then_first_come_first_served() -> None:
    late, early = _waiting("late", 9, count=1), _waiting("early", 3, count=1)
    order = in_order([late, early, _waiting("vip", 12, priority=5, count=1)])
    assert [w.entry.job for w in order] == ["vip", "early", "late"]


def test_a_request_for_other_gpus_or_one_that_cannot_fit_blocks_no_one() -> None:
    eight = range(8)
    assert not could_use(_waiting("x", 1, gpus=(2, 3)).entry, [0, 1], eight)
    assert could_use(_waiting("x", 1, gpus=(1, 3)).entry, [0, 1], eight)
    assert could_use(_waiting("x", 1, count=8).entry, [0], eight)
    assert not could_use(_waiting("x", 1, count=9).entry, [0], eight)  # can never fit


def test_small_requests_wait_behind_an_older_large_one_that_could_use_their_gpus() -> None:
    order = in_order([_waiting("large", 1, count=4), _waiting("small", 2, count=1)])
    assert [w.entry.job for w in blockers(order, "/q/small", [0], _all)] == ["large"]
    assert blockers(order, "/q/large", [0, 1, 2, 3], _all) == []


def test_an_entry_over_quota_is_skipped() -> None:
    order = in_order([_waiting("greedy", 1, count=1), _waiting("next", 2, count=1)])
    skipped = blockers(order, "/q/next", [0], _all, over_quota=lambda w: w.entry.job == "greedy")
    assert skipped == []


def test_could_use_counts_only_the_gpus_the_request_could_be_given() -> None:
    three = frozenset({0, 1, 2})  # GPU 3 reserved for others, say
    assert not could_use(_waiting("x", 1, count=4).entry, [0], three)  # can never be placed
    assert could_use(_waiting("x", 1, count=3).entry, [0], three)
    assert not could_use(_waiting("x", 1, count=1).entry, [3], three)  # never its GPU
    assert not could_use(_waiting("x", 1, gpus=(2, 3)).entry, [2], three)  # can never have 3


def test_an_unplaceable_request_ahead_blocks_no_one_behind_it() -> None:
    order = in_order([_waiting("big", 1, count=4), _waiting("small", 2, count=1)])
    assert blockers(order, "/q/small", [0], lambda _e: frozenset({0, 1, 2})) == []


def test_an_entry_without_a_lease_blocks_no_one() -> None:
    order = in_order([_waiting("ghost", 1, count=1, leased=False), _waiting("me", 2, count=1)])
    assert blockers(order, "/q/me", [0], _all) == []


def test_wanted_ahead_names_the_gpus_an_explicit_request_ahead_could_use() -> None:
    order = in_order([_waiting("pair", 1, gpus=(0, 1)), _waiting("me", 2, count=1)])
    assert wanted_ahead(order, "/q/me", sorted(FOUR), _all) == {0, 1}


def test_a_submitted_entry_is_live_while_its_hosts_agent_is() -> None:
    submitted = QueueEntry(
        job="batch", host="node1", holder="u", since="t", count=1, submission="u/batch"
    )
    by_hand = QueueEntry(job="hand", host="node1", holder="u", since="t", count=1)
    items = [
        KeyValue("/q/batch", submitted.to_json(), 5, 5),
        KeyValue("/q/hand", by_hand.to_json(), 6, 6),
    ]
    alive = decode_queue(items, lambda _bad: None)
    assert [(w.entry.job, w.leased) for w in alive] == [("batch", True), ("hand", False)]
    gone = decode_queue(items, lambda _bad: None, agent_alive=False)
    assert [w.leased for w in gone] == [False, False]


def _on(host: str, name: str, arrived: int, *, job: str = "", **look: object) -> Waiting:
    entry = QueueEntry(job=job or name, host=host, holder="u", since="t", count=1, **look)  # type: ignore[arg-type]
    return Waiting(f"/q/{host}/{name}", entry, arrived, arrived)


def test_two_gangs_sort_alike_in_every_queue_they_share() -> None:
    # A gang's entries are one transaction: one name and one creating revision on each host.
    # Ties of priority and factor break alike too: by the entry's name, the same everywhere.
    def gangs(host: str) -> list[Waiting]:
        return [
            _on(host, "bb", 7, job="g2", fair_share=0.5),
            _on(host, "aa", 7, job="g1", fair_share=0.5),
            _on(host, "cc", 4, job="g3", fair_share=0.2),
            _on(host, "dd", 9, job="g4", priority=3),
        ]

    alone = {"node1": [_on("node1", "s1", 5)], "node2": [_on("node2", "s2", 2, priority=4)]}
    orders = {
        host: [w.entry.job for w in in_order([*gangs(host), *alone[host]]) if w.entry.job[0] == "g"]
        for host in ("node1", "node2")
    }
    assert orders["node1"] == orders["node2"] == ["g4", "g1", "g2", "g3"]


def test_a_preemptible_entry_sorts_after_every_normal_one() -> None:
    first = _waiting("first", 1, priority=5, count=1, preemptible=True)
    order = in_order([first, _waiting("low", 9, priority=-5, count=1)])
    assert [w.entry.job for w in order] == ["low", "first"]


def test_a_preemptible_entry_waits_only_for_normal_entries_that_fit_without_preemptible_ones() -> (
    None
):
    order = in_order(
        [
            _waiting("fits", 1, gpus=(0,)),
            _waiting("never", 2, count=4),
            _waiting("pre", 3, count=1, preemptible=True),
        ]
    )
    fits_only = lambda w: w.entry.job == "fits"  # noqa: E731
    ahead = blockers(order, "/q/pre", [0], _all, normal_fits=fits_only)
    assert [w.entry.job for w in ahead] == ["fits"]
    assert blockers(order, "/q/pre", [1], _all, normal_fits=fits_only) == []  # GPU 1: no one's
    # A normal entry's turn is as before: preemptible entries are never ahead of it.
    assert blockers(order, "/q/never", [1, 2, 3], _all) == []
