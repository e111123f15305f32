"""Hold-down and flap limit: a flapping GPU costs a bounded number of restarts (pure, fake time)."""

from __future__ import annotations

import itertools

import pytest

from allocator.agent.gpu_care.hold_down import (
    Damping,
    FlapLimit,
    GpuHoldDown,
    JobGpus,
    hold_down_for,
)
from tests.support.clock import FakeClock

SETTINGS = Damping(hold_down_seconds=10.0, hold_down_max_seconds=80.0, flap_restart_limit=3)
BAD = {1: "XID 79 (GPU has fallen off the bus)"}


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(0, 0.0), (1, 10.0), (2, 20.0), (3, 40.0), (4, 80.0), (5, 80.0), (10_000, 80.0)],
)
def test_hold_down_doubles_with_each_failure_up_to_the_cap(failures: int, seconds: float) -> None:
    assert hold_down_for(failures, 10.0, 80.0) == seconds


def test_no_base_means_no_hold_down() -> None:
    assert hold_down_for(3, 0.0, 80.0) == 0.0


class Host:
    """A hold-down and a flap limit fed one health verdict per call, on a fake clock."""

    def __init__(self, settings: Damping = SETTINGS) -> None:
        self.settings = settings
        self.clock = FakeClock(0.0)
        self.gpus = GpuHoldDown()
        self.flaps = FlapLimit()
        self.events: list[str] = []

    def check(self, unhealthy: dict[int, str], after: float = 1.0) -> dict[int, str]:
        """Move the clock by ``after`` seconds, then apply the verdict."""
        self.clock.advance(after)
        out, events = self.gpus.update(unhealthy, self.settings, self.clock())
        self.events += [name for name, _ in events]
        return out

    def job(self, unhealthy: dict[int, str], after: float = 1.0) -> tuple[bool, bool]:
        """One check for a cpu-fallback job on GPU 1: (on its GPU?, pinned?)."""
        out = self.check(unhealthy, after)
        pins, events = self.flaps.update(
            {"train": JobGpus((1,), "cpu")}, out, self.gpus, self.settings, self.clock()
        )
        self.events += [name for name, _ in events]
        on_gpu = 1 not in out and "train" not in pins
        return on_gpu, "train" in pins


def test_a_recovered_gpu_stays_out_for_the_hold_down() -> None:
    host = Host()
    assert host.check(BAD) == BAD
    assert host.check({}, after=1.0) == BAD  # healthy, but held down for 10 s
    assert host.check({}, after=9.0) == BAD
    assert host.check({}, after=1.0) == {}
    assert host.events == ["gpu-out", "gpu-hold-down", "gpu-returned"]


def test_the_reason_a_gpu_went_out_with_stays_while_it_is_out() -> None:
    host = Host()
    host.check(BAD)
    assert host.check({1: "device error: GPU is lost"}) == BAD
    assert host.check({}) == BAD  # held down: still the first reason


def test_each_further_failure_doubles_the_hold_down() -> None:
    host = Host()
    held = []
    for _ in range(5):
        host.check(BAD)
        host.check({}, after=0.0)
        start = host.clock()
        while host.check({}, after=1.0):
            pass
        held.append(host.clock() - start)
    assert held == [10.0, 20.0, 40.0, 80.0, 80.0]


def test_failing_again_while_held_down_starts_a_longer_hold() -> None:
    host = Host()
    host.check(BAD)
    host.check({})  # held until t=12
    host.check(BAD, after=2.0)  # fails in the hold-down
    assert "gpu-failed-in-hold-down" in host.events
    host.check({}, after=1.0)  # now held for 20 s
    assert host.check({}, after=19.0) == BAD
    assert host.check({}, after=1.0) == {}


def test_a_gpu_stable_for_the_cap_forgets_its_failures() -> None:
    host = Host()
    for _ in range(3):  # three failures: the next hold-down would be 40 s
        host.check(BAD)
        while host.check({}, after=1.0):
            pass
    assert not host.gpus.stable(1, SETTINGS, host.clock())
    host.check({}, after=80.0)  # in service for the cap
    assert host.gpus.stable(1, SETTINGS, host.clock())
    host.check(BAD)
    host.check({}, after=0.0)
    assert host.check({}, after=10.0) == {}  # back to the first, shortest hold-down


def test_state_round_trips_through_to_dict() -> None:
    host = Host()
    host.check(BAD)
    host.check({})
    again = GpuHoldDown(host.gpus.to_dict())
    assert again.out() == host.gpus.out()
    assert again.to_dict() == host.gpus.to_dict()
    assert again.unhealthy_now() == {}  # held down, no longer failing


@pytest.mark.parametrize(("limit", "moves"), [(0, 1), (1, 1), (2, 3), (3, 3), (4, 5)])
def test_a_flapping_gpu_moves_its_job_at_most_limit_plus_one_times(limit: int, moves: int) -> None:
    # Returning to the GPU is what the limit refuses; moving off a bad GPU never is.
    host = Host(
        Damping(hold_down_seconds=0.0, hold_down_max_seconds=80.0, flap_restart_limit=limit)
    )
    places = [(True, False)]
    for _ in range(20):  # flap every second for 40 s
        places.append(host.job(BAD))
        places.append(host.job({}))
    moved = sum(1 for a, b in itertools.pairwise(places) if a[0] != b[0])
    assert moved == moves <= limit + 1
    assert places[-1] == (False, True)  # it stays on CPU
    assert host.events.count("job-flap-limit") == 1


def test_a_pinned_job_returns_once_its_gpu_has_been_stable_and_counts_afresh() -> None:
    host = Host(Damping(hold_down_seconds=0.0, hold_down_max_seconds=80.0, flap_restart_limit=1))
    assert host.job(BAD) == (False, False)  # moved off: restart 1 of 1
    assert host.job({}) == (False, True)  # the limit: stays on CPU
    assert host.job({}, after=78.0) == (False, True)  # in service for 78 s
    assert host.job({}, after=2.0) == (True, False)  # 80 s: stable, back on its GPU
    assert host.events[-1] == "job-flap-released"
    assert host.flaps.restarts("train") == 0


def test_a_job_never_is_pinned_to_a_bad_gpu() -> None:
    host = Host(Damping(hold_down_seconds=0.0, hold_down_max_seconds=80.0, flap_restart_limit=0))
    assert host.job({}) == (True, False)
    assert host.job(BAD) == (False, False)  # moving off is never refused
    assert host.job({}) == (False, True)


def test_a_pin_keeps_the_reasons_the_job_moved_off_with() -> None:
    # The reason is the worker's ALLOCATOR_FALLBACK_REASON: the same text, no restart.
    host = Host(Damping(hold_down_seconds=0.0, hold_down_max_seconds=80.0, flap_restart_limit=1))
    host.job(BAD)
    out = host.check({})
    pins, _ = host.flaps.update(
        {"train": JobGpus((1,), "cpu")}, out, host.gpus, host.settings, host.clock()
    )
    assert dict(pins["train"].unhealthy) == BAD
    assert "stays on CPU" in pins["train"].note and "flap_restart_limit 1" in pins["train"].note


def test_a_job_moved_to_other_gpus_or_released_starts_a_new_count() -> None:
    host = Host(Damping(hold_down_seconds=0.0, hold_down_max_seconds=80.0, flap_restart_limit=1))
    host.job(BAD)
    assert host.flaps.restarts("train") == 1
    out = host.check({})
    host.flaps.update({"train": JobGpus((2,), "cpu")}, out, host.gpus, SETTINGS, host.clock())
    assert host.flaps.restarts("train") == 0
    host.flaps.update({}, out, host.gpus, SETTINGS, host.clock())
    assert host.flaps.to_dict() == {}
