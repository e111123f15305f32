"""Keeping a stopped ``run``'s lease alive: refreshed while it is stopped, and only then."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from allocator.errors import LeaseLost, StoreUnavailable
from allocator.recipes.stopped_keeper import keep_while_stopped, process_state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _states(*spans: tuple[str, float], clock: Clock) -> Iterator[str]:
    """``state()`` answers: each letter until ``clock`` passes its end time."""
    for letter, until in spans:
        while clock.now < until:
            yield letter
    while True:
        yield "S"


def test_it_refreshes_every_third_of_the_ttl_while_stopped_then_hands_back() -> None:
    clock, refreshed, announced = Clock(), [], []
    states = _states(("R", 0.2), ("T", 10.0), clock=clock)
    keep_while_stopped(
        lambda: refreshed.append(clock.now),
        3.0,
        lambda: next(states),
        lambda: announced.append(clock.now),
        monotonic=clock,
        sleep=clock.sleep,
    )
    assert announced == [0.0] and refreshed[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(refreshed)]
    assert len(refreshed) >= 9 and all(0.99 <= gap <= 1.1 for gap in gaps), refreshed
    assert 10.0 <= clock.now < 10.2  # back to the holder's own keeper at once


def test_a_holder_that_never_stops_is_left_alone_after_a_few_seconds() -> None:
    clock, refreshed = Clock(), []
    keep_while_stopped(lambda: refreshed.append(clock.now), 3.0, lambda: "S", lambda: None,
                       monotonic=clock, sleep=clock.sleep)  # fmt: skip
    assert refreshed == [0.0] and clock.now <= 5.1


def test_an_unreachable_store_is_retried_and_a_lost_lease_ends_it() -> None:
    clock, calls = Clock(), []

    def refresh() -> None:
        calls.append(clock.now)
        if len(calls) == 2:
            raise StoreUnavailable("down")
        if len(calls) == 3:
            raise LeaseLost("gone")

    keep_while_stopped(refresh, 3.0, lambda: "T", lambda: None, monotonic=clock, sleep=clock.sleep)
    assert len(calls) == 3 and calls[2] - calls[1] < 0.1  # the failed refresh was tried again


def test_the_state_of_a_process_that_is_gone_is_empty() -> None:
    assert process_state(2**22 + 1) == ""
