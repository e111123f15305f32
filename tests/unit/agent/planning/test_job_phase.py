"""A job's life as a state machine: the transition table itself, and what is published."""

from __future__ import annotations

import itertools

import pytest

from allocator.agent.planning.job_phase import (
    TRANSITIONS,
    JobEvent,
    JobPhase,
    next_phase,
    published_state,
)

P = JobPhase
E = JobEvent

# Written out by hand, apart from the table: the two must agree on every pair.
LEGAL: dict[tuple[JobPhase, JobEvent], JobPhase] = {
    (P.RUNNING, E.START): P.RUNNING,
    (P.STOPPED, E.START): P.RUNNING,
    (P.CRASHED, E.START): P.RUNNING,
    (P.BACKOFF, E.START): P.RUNNING,
    (P.GAVE_UP, E.START): P.RUNNING,
    (P.WAITING, E.START): P.RUNNING,
    (P.RUNNING, E.STOP): P.STOPPING,
    (P.STOPPED, E.STOP): P.STOPPING,
    (P.CRASHED, E.STOP): P.CLEARING,
    (P.BACKOFF, E.STOP): P.CLEARING,
    (P.GAVE_UP, E.STOP): P.CLEARING,
    (P.STOPPING, E.STOP_DONE): P.STOPPED,
    (P.CLEARING, E.STOP_DONE): P.CRASHED,
    (P.RUNNING, E.CRASH): P.CRASHED,
    (P.CRASHED, E.CRASH): P.CRASHED,
    (P.BACKOFF, E.CRASH): P.BACKOFF,
    (P.GAVE_UP, E.CRASH): P.GAVE_UP,
    (P.RUNNING, E.SCHEDULE_RESTART): P.RUNNING,
    (P.CRASHED, E.SCHEDULE_RESTART): P.BACKOFF,
    (P.BACKOFF, E.SCHEDULE_RESTART): P.BACKOFF,
    (P.RUNNING, E.GIVE_UP): P.GAVE_UP,
    (P.CRASHED, E.GIVE_UP): P.GAVE_UP,
    (P.BACKOFF, E.GIVE_UP): P.GAVE_UP,
    (P.RUNNING, E.HOLD): P.WAITING,
    (P.RUNNING, E.ACCEPT): P.RUNNING,
    (P.STOPPING, E.ACCEPT): P.STOPPING,
    (P.CLEARING, E.ACCEPT): P.CLEARING,
    (P.STOPPED, E.ACCEPT): P.STOPPED,
    (P.CRASHED, E.ACCEPT): P.CRASHED,
    (P.BACKOFF, E.ACCEPT): P.CRASHED,
    (P.GAVE_UP, E.ACCEPT): P.CRASHED,
    (P.WAITING, E.ACCEPT): P.WAITING,
    (P.RUNNING, E.FINISH): P.FINISHED,
    (P.CRASHED, E.FINISH): P.FINISHED,
    (P.BACKOFF, E.FINISH): P.FINISHED,
    (P.FINISHED, E.START): P.RUNNING,
    (P.FINISHED, E.ACCEPT): P.FINISHED,
}


@pytest.mark.parametrize(("phase", "event"), sorted(LEGAL, key=lambda k: (k[0].value, k[1].value)))
def test_every_legal_transition_goes_where_the_table_says(phase: JobPhase, event: JobEvent) -> None:
    assert next_phase(phase, event) is LEGAL[phase, event]


ILLEGAL = sorted(
    set(itertools.product(JobPhase, JobEvent)) - LEGAL.keys(),
    key=lambda k: (k[0].value, k[1].value),
)


@pytest.mark.parametrize(("phase", "event"), ILLEGAL)
def test_every_other_transition_is_refused(phase: JobPhase, event: JobEvent) -> None:
    assert next_phase(phase, event) is None


def test_the_table_lists_nothing_else() -> None:
    assert dict(TRANSITIONS) == LEGAL


def test_nothing_starts_and_nothing_crashes_while_a_stop_is_under_way() -> None:
    for phase in (P.STOPPING, P.CLEARING):
        assert phase.stopping
        assert next_phase(phase, E.START) is None
        assert next_phase(phase, E.CRASH) is None  # an exit during a stop is ours
        assert next_phase(phase, E.STOP) is None  # a second stop only shortens the grace
    assert not any(p.stopping for p in JobPhase if p not in (P.STOPPING, P.CLEARING))


@pytest.mark.parametrize(
    ("phase", "alive", "codes", "shown"),
    [
        (P.RUNNING, 1, (None,), "running"),
        (P.RUNNING, 0, (0, 0), "exited"),
        (P.RUNNING, 0, (0, None), "stopped"),  # gone without an exit code
        (P.STOPPED, 0, (143,), "stopped"),
        (P.STOPPED, 0, (0,), "exited"),  # it took SIGTERM as its cue to finish
        (P.STOPPING, 1, (None,), "stopping"),
        (P.CLEARING, 1, (1, None), "stopping"),
        (P.CRASHED, 1, (1, None), "crashed"),
        (P.CRASHED, 0, (1,), "crashed"),
        (P.BACKOFF, 0, (1,), "backoff"),
        (P.GAVE_UP, 0, (1,), "gave-up"),
    ],
)
def test_the_published_state_follows_the_phase(
    phase: JobPhase, alive: int, codes: tuple[int | None, ...], shown: str
) -> None:
    assert published_state(phase, alive, codes) == shown
