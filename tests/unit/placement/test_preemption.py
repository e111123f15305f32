"""Which preemptible holdings a normal request takes GPUs back from (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from allocator.placement.choose import Request
from allocator.placement.preemption import MAX_EXACT, Host, choose_preempted
from allocator.policy.model import Host as PolicyHost
from allocator.policy.model import Policy
from allocator.records.types import Assignment

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOST = Host(Policy(version=1, hosts={"node1": PolicyHost("node1", 4)}), NOW)


def held(
    job: str, *gpus: int, at: str = "10:00", preemptible: bool = True, by: str = ""
) -> Assignment:
    """``job`` holding ``gpus`` of node1 since ``at`` (a later time: a younger holding)."""
    return Assignment(
        job=job,
        host="node1",
        gpus=gpus,
        mode="gpu",
        updated_by="alice",
        updated_at=f"2026-06-01T{at}:00Z",
        preemptible=preemptible,
        preempted_by=by,
    )


def on(*assignments: Assignment) -> dict[str, Assignment]:
    return {a.job: a for a in assignments}


def count(n: int, *, preemptible: bool = False) -> Request:
    return Request(job="normal", host="node1", count=n, preemptible=preemptible)


def test_the_fewest_holdings_that_make_it_fit() -> None:
    # Two GPUs are wanted: the one holding of two beats the two holdings of one.
    found = on(held("a", 0, at="11:00"), held("b", 1, at="11:30"), held("pair", 2, 3, at="09:00"))
    chosen = choose_preempted(count(2), found, HOST)
    assert chosen is not None
    assert chosen.jobs == ("pair",)
    assert sorted(chosen.placement.gpus) == [2, 3]


def test_among_as_few_the_youngest() -> None:
    found = on(
        held("old", 0, at="08:00"), held("young", 1, at="11:00"), held("x", 2, 3, preemptible=False)
    )
    chosen = choose_preempted(count(1), found, HOST)
    assert chosen is not None and chosen.jobs == ("young",)


def test_a_named_gpu_takes_back_exactly_its_holder() -> None:
    found = on(
        held("old", 0, at="08:00"), held("young", 1, at="11:00"), held("x", 2, 3, preemptible=False)
    )
    asked = Request(job="normal", host="node1", gpus=(0,))
    chosen = choose_preempted(asked, found, HOST)
    assert chosen is not None and chosen.jobs == ("old",)


def test_never_a_normal_holding_and_nothing_when_it_would_not_fit_anyway() -> None:
    # Three GPUs held normally: even with the preemptible one gone, two do not fit.
    found = on(held("n", 0, 1, 2, preemptible=False), held("p", 3))
    assert choose_preempted(count(2), found, HOST) is None
    assert choose_preempted(Request(job="normal", host="node1", gpus=(0,)), found, HOST) is None


def test_nothing_when_it_fits_already_or_is_preemptible_itself() -> None:
    found = on(held("p", 0))
    assert choose_preempted(count(1), found, HOST) is None  # GPUs 1-3 are free
    full = on(held("p", 0, 1, 2, 3))
    assert choose_preempted(count(1, preemptible=True), full, HOST) is None


def test_a_holding_already_stopping_counts_as_gone() -> None:
    found = on(held("stopping", 0, 1, by="earlier"), held("p", 2, 3))
    chosen = choose_preempted(count(2), found, HOST)
    assert chosen is not None
    assert chosen.jobs == ()  # what is stopping is enough: nothing more to take back
    assert chosen.stopping == ("stopping",)


def test_many_holdings_take_the_youngest_first() -> None:
    policy = Policy(version=1, hosts={"node1": PolicyHost("node1", MAX_EXACT + 2)})
    many = [held(f"p{i}", i, at=f"10:{i:02d}") for i in range(MAX_EXACT + 2)]
    chosen = choose_preempted(count(2), on(*many), Host(policy, NOW))
    assert chosen is not None
    assert chosen.jobs == (f"p{MAX_EXACT + 1}", f"p{MAX_EXACT}")
