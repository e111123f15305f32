"""How a job's end is judged: ``restart`` and ``release_on_exit`` (the planner, pure).

``on-failure`` (the default, the agent's behaviour before the field existed)
restarts a non-zero exit only; ``always`` restarts any; ``never`` none. A
status ``release_on_exit`` names ends the job and releases its GPUs, whatever
``restart`` says: a job whose assignment the agent releases never starts again.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from allocator.agent.planning.job_phase import (
    BackingOff,
    Finished,
    JobEvent,
    JobPhase,
    Running,
    next_phase,
    published_state,
)
from allocator.agent.planning.reconcile import job_status, plan, restarts_after
from allocator.agent.planning.types import (
    Action,
    DesiredJob,
    Finish,
    JobView,
    RestartRule,
    ScheduleRestart,
    Start,
    Stop,
)

T0 = 1000.0

WANT = DesiredJob(
    job="train",
    state="run",
    workers=(),
    fingerprint="fp",
    on_change="restart",
    grace_seconds=5.0,
    max_restarts=3,
    backoff_base=2.0,
    backoff_max=30.0,
    gpus=(0, 1),
    device="cuda",
    fallback_reason=None,
    message="",
    assignment_revision=7,
)


def ended(*codes: int | None, alive: int = 0, **fields: object) -> JobView:
    """The view of a job whose workers ended with ``codes`` (None: still running)."""
    base = JobView(
        job="train",
        fingerprint="fp",
        alive=alive,
        phase=Running(T0 - 100),
        exit_codes=codes,
        crash_restarts=0,
        change_restarts=0,
        assignment_revision=7,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def planned(
    view: JobView, restart: RestartRule = "on-failure", release: tuple[int, ...] = ()
) -> list[Action]:
    return plan(
        {"train": replace(WANT, restart=restart, release_on_exit=release)}, {"train": view}, T0
    )


@pytest.mark.parametrize(
    ("restart", "status", "again"),
    [
        ("on-failure", 0, False),
        ("on-failure", 1, True),
        ("on-failure", 137, True),
        ("always", 0, True),
        ("always", 2, True),
        ("never", 0, False),
        ("never", 1, False),
    ],
)
def test_the_restart_rule_says_which_ends_start_again(
    restart: RestartRule, status: int, again: bool
) -> None:
    assert restarts_after(restart, status) is again


def test_on_failure_is_the_default_and_finishes_a_clean_exit() -> None:
    assert WANT.restart == "on-failure" and WANT.release_on_exit == ()
    assert planned(ended(0, 0)) == [Finish("train", 0, False, "finished (exit 0)")]
    assert planned(ended(0, 1)) == [ScheduleRestart("train", T0 + 2.0)]


def test_restart_never_leaves_a_crashed_job_finished_with_its_status() -> None:
    assert planned(ended(3), "never") == [
        Finish("train", 3, False, "finished (exit 3); restart: never")
    ]


def test_restart_always_restarts_a_clean_exit_after_the_backoff() -> None:
    assert planned(ended(0), "always") == [ScheduleRestart("train", T0 + 2.0)]
    assert planned(ended(0, phase=BackingOff(T0)), "always") == [
        Start("train", replace(WANT, restart="always"), "crash")
    ]


def test_release_on_exit_releases_at_its_statuses_only_and_wins_over_restart() -> None:
    reason = "finished (exit 0); its GPUs released (release_on_exit)"
    assert planned(ended(0, 0), "always", (0,)) == [Finish("train", 0, True, reason)]
    assert planned(ended(1), "on-failure", (0,)) == [ScheduleRestart("train", T0 + 2.0)]
    three = planned(ended(3), "on-failure", (0, 3))
    assert three == [
        Finish("train", 3, True, "finished (exit 3); its GPUs released (release_on_exit)")
    ]


def test_a_crash_stops_the_other_ranks_first_and_its_code_is_the_jobs_status() -> None:
    assert planned(ended(1, None, alive=1), "never") == [
        Stop("train", "worker crashed: worker 0 exited with 1", 5.0)
    ]
    cleared = ended(143, 1, exit_status=1)  # rank 0 was stopped (143) after rank 1 crashed
    assert job_status(cleared) == 1
    assert planned(cleared, "never") == [
        Finish("train", 1, False, "finished (exit 1); restart: never")
    ]


def test_a_finished_job_is_never_restarted_until_it_is_set_again() -> None:
    done = ended(0, phase=Finished(), exit_status=None)
    assert planned(done, "always") == []
    assert planned(done, "always", (0,)) == []
    again = plan({"train": replace(WANT, assignment_revision=9)}, {"train": done}, T0)
    assert again == [Start("train", replace(WANT, assignment_revision=9), "new")]


def test_one_rank_that_finished_waits_for_the_others() -> None:
    assert planned(ended(0, None, alive=1), "never", (0,)) == []


def test_finished_and_gave_up_are_different_phases_and_states() -> None:
    for phase in (JobPhase.RUNNING, JobPhase.CRASHED, JobPhase.BACKOFF):
        assert next_phase(phase, JobEvent.FINISH) is JobPhase.FINISHED
    assert next_phase(JobPhase.STOPPING, JobEvent.FINISH) is None
    assert next_phase(JobPhase.FINISHED, JobEvent.START) is JobPhase.RUNNING
    assert next_phase(JobPhase.FINISHED, JobEvent.CRASH) is None
    assert published_state(JobPhase.FINISHED, 0, [0]) == "finished"
    assert published_state(JobPhase.GAVE_UP, 0, [1]) == "gave-up"
