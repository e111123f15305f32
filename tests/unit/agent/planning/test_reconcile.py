"""plan(desired, running, now) -> actions, and the crash backoff maths."""

from __future__ import annotations

import dataclasses
import signal
from typing import Literal

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from allocator.agent.planning.job_phase import BackingOff, GaveUp, JobState, Running, Stopping
from allocator.agent.planning.reconcile import change_signal, crash_backoff, plan
from allocator.agent.planning.types import (
    Accept,
    Action,
    Confirm,
    DesiredJob,
    DesiredState,
    Finish,
    Forget,
    GiveUp,
    JobView,
    ScheduleRestart,
    SignalJob,
    Start,
    Stop,
)

T0 = 1000.0


def want(
    job: str = "train",
    fingerprint: str = "fp-1",
    *,
    state: DesiredState = "run",
    on_change: str = "restart",
    gpus: tuple[int, ...] = (0, 1),
    device: Literal["cuda", "cpu"] = "cuda",
    max_restarts: int = 3,
    backoff_base: float = 2.0,
    backoff_max: float = 30.0,
    grace_seconds: float = 5.0,
    message: str = "",
    revision: int = 1,
) -> DesiredJob:
    """A desired job; its workers do not matter to the planner."""
    return DesiredJob(
        job=job,
        state=state,
        workers=(),
        fingerprint=fingerprint,
        on_change=on_change,
        grace_seconds=grace_seconds,
        max_restarts=max_restarts,
        backoff_base=backoff_base,
        backoff_max=backoff_max,
        gpus=gpus,
        device=device,
        fallback_reason=None,
        message=message,
        assignment_revision=revision,
    )


def phase_of(stopping: bool, gave_up: bool, restart_at: float | None, since: float) -> JobState:
    """The phase record a supervisor reports for a job in that state."""
    if stopping:
        return Stopping(None)
    if gave_up:
        return GaveUp()
    if restart_at is not None:
        return BackingOff(restart_at)
    return Running(since)


def view(
    job: str = "train",
    fingerprint: str = "fp-1",
    *,
    exit_codes: tuple[int | None, ...] = (None, None),
    alive: int | None = None,
    stopping: bool = False,
    crash_restarts: int = 0,
    next_restart_at: float | None = None,
    gave_up: bool = False,
    gpus: tuple[int, ...] = (0, 1),
    device: Literal["cuda", "cpu"] = "cuda",
    grace_seconds: float = 7.0,
    revision: int = 1,
) -> JobView:
    """The supervisor's view of a job; ``alive`` defaults to the workers still running."""
    return JobView(
        job=job,
        fingerprint=fingerprint,
        alive=sum(code is None for code in exit_codes) if alive is None else alive,
        phase=phase_of(stopping, gave_up, next_restart_at, T0 - 100),
        exit_codes=exit_codes,
        crash_restarts=crash_restarts,
        change_restarts=0,
        gpus=gpus,
        device=device,
        grace_seconds=grace_seconds,
        assignment_revision=revision,
    )


def plan_one(desired: DesiredJob | None, running: JobView | None, now: float = T0) -> list[Action]:
    """plan() for the single job 'train'."""
    return plan(
        {} if desired is None else {"train": desired},
        {} if running is None else {"train": running},
        now,
    )


GONE = (143, 143)  # both workers ended by SIGTERM: the group is gone

# (case id, desired, running, now, expected actions)
RULES: list[tuple[str, DesiredJob | None, JobView | None, float, list[Action]]] = [
    # rule 2: desired, not running
    ("new job starts", want(), None, T0, [Start("train", want(), "new")]),
    ("running as desired: nothing", want(), view(), T0, []),
    # rule 1: running, not desired
    (
        "released: stop with its grace",
        None,
        view(),
        T0,
        [Stop("train", "assignment released", 7.0)],
    ),
    ("released and stopping: wait", None, view(stopping=True), T0, []),
    ("released and gone: forget", None, view(exit_codes=GONE), T0, [Forget("train")]),
    ("nothing at all", None, None, T0, []),
    # rule 3: fingerprint changed
    (
        "change, restart: stop first",
        want(fingerprint="fp-2"),
        view(),
        T0,
        [Stop("train", "assignment changed", 5.0)],
    ),
    ("change, restart, stopping: wait", want(fingerprint="fp-2"), view(stopping=True), T0, []),
    (
        "change, restart, one group still alive: wait",
        want(fingerprint="fp-2"),
        view(exit_codes=(143, None), stopping=True),
        T0,
        [],
    ),
    (
        "change, restart, old group gone: start",
        want(fingerprint="fp-2"),
        view(exit_codes=GONE),
        T0,
        [Start("train", want(fingerprint="fp-2"), "change")],
    ),
    (
        "change, signal: signal and accept",
        want(fingerprint="fp-2", on_change="signal:SIGHUP"),
        view(),
        T0,
        [SignalJob("train", int(signal.SIGHUP), "fp-2")],
    ),
    (
        "change, none: accept",
        want(fingerprint="fp-2", on_change="none"),
        view(),
        T0,
        [Accept("train", "fp-2")],
    ),
    (
        "gpu move, on_change none: restart anyway",
        want(fingerprint="fp-2", on_change="none", gpus=(2, 3)),
        view(),
        T0,
        [Stop("train", "assignment changed", 5.0)],
    ),
    (
        "gpu move, on_change signal: restart anyway",
        want(fingerprint="fp-2", on_change="signal:SIGUSR1", gpus=(1, 0)),
        view(),
        T0,
        [Stop("train", "assignment changed", 5.0)],
    ),
    (
        "move to cpu, on_change none: restart anyway",
        want(fingerprint="fp-2", on_change="none", gpus=(), device="cpu"),
        view(),
        T0,
        [Stop("train", "assignment changed", 5.0)],
    ),
    (
        "change, none, workers finished: start the new spec",
        want(fingerprint="fp-2", on_change="none"),
        view(exit_codes=(0, 0)),
        T0,
        [Start("train", want(fingerprint="fp-2", on_change="none"), "change")],
    ),
    (
        "change after giving up: start again",
        want(fingerprint="fp-2"),
        view(exit_codes=(1, 143), crash_restarts=3, gave_up=True),
        T0,
        [Start("train", want(fingerprint="fp-2"), "change")],
    ),
    # rule 4: crashes
    (
        "crash: stop the other workers",
        want(),
        view(exit_codes=(None, 1)),
        T0,
        [Stop("train", "worker crashed: worker 1 exited with 1", 5.0)],
    ),
    ("crash, stopping the others: wait", want(), view(exit_codes=(None, 1), stopping=True), T0, []),
    (
        "crash, all gone: schedule with backoff",
        want(),
        view(exit_codes=(143, 1), crash_restarts=2),
        T0,
        [ScheduleRestart("train", T0 + 8.0)],
    ),
    (
        "crash, restart not due yet: wait",
        want(),
        view(exit_codes=(143, 1), next_restart_at=T0 + 1),
        T0,
        [],
    ),
    (
        "crash, restart due: start",
        want(),
        view(exit_codes=(143, 1), next_restart_at=T0),
        T0,
        [Start("train", want(), "crash")],
    ),
    (
        "crash limit reached: give up",
        want(),
        view(exit_codes=(139, 143), crash_restarts=3),
        T0,
        [
            GiveUp(
                "train",
                "worker 0 exited with 139 (SIGSEGV); gave up after 3 crash restarts "
                "(max_restarts 3); waiting for the assignment or policy to change",
            )
        ],
    ),
    (
        "gave up: nothing more",
        want(),
        view(exit_codes=(1, 143), crash_restarts=3, gave_up=True),
        T0,
        [],
    ),
    (
        "every worker exited 0: finished",
        want(),
        view(exit_codes=(0, 0), alive=0),
        T0,
        [Finish("train", 0, False, "finished (exit 0)")],
    ),
    ("one rank finished early: nothing", want(), view(exit_codes=(0, None)), T0, []),
    (
        "set again, same spec, while it runs: the new revision noted",
        want(revision=5),
        view(),
        T0,
        [Confirm("train", 5)],
    ),
    ("set again while it stops: nothing", want(revision=5), view(stopping=True), T0, []),
    (
        "set again once every worker ended, shims clearing up: no note (a new run)",
        want(revision=5),
        view(exit_codes=(0, 0), alive=1),
        T0,
        [],
    ),
    (
        "set again while a rank crashed: the stop, no note",
        want(revision=5),
        view(exit_codes=(1, None)),
        T0,
        [Stop("train", "worker crashed: worker 0 exited with 1", 5.0)],
    ),
    (
        "workers gone without exit codes: a crash",
        want(),
        view(exit_codes=(None, None), alive=0),
        T0,
        [ScheduleRestart("train", T0 + 2.0)],
    ),
    # states other than run: never started, and running workers are stopped
    ("undeclared: never started", want(state="undeclared", message="m"), None, T0, []),
    ("refused: never started", want(state="refused", message="m"), None, T0, []),
    ("wait: never started", want(state="wait", message="m"), None, T0, []),
    ("failed: never started", want(state="failed", message="m"), None, T0, []),
    (
        "wait: running workers stop with the job's grace",
        want(state="wait", message="GPU 1 unhealthy: xid 79; waiting"),
        view(),
        T0,
        [Stop("train", "GPU 1 unhealthy: xid 79; waiting", 5.0)],
    ),
    (
        "failed: running workers stop",
        want(state="failed", message="GPU 0 unhealthy: xid 48; failed"),
        view(),
        T0,
        [Stop("train", "GPU 0 unhealthy: xid 48; failed", 5.0)],
    ),
    (
        "refused: running workers stop",
        want(state="refused", message="not allowed"),
        view(),
        T0,
        [Stop("train", "not allowed", 5.0)],
    ),
    (
        "undeclared: stop with the grace it was started with",
        want(state="undeclared", message="not declared"),
        view(),
        T0,
        [Stop("train", "not declared", 7.0)],
    ),
    (
        "wait and gone: forget",
        want(state="wait", message="m"),
        view(exit_codes=GONE),
        T0,
        [Forget("train")],
    ),
]


@pytest.mark.parametrize(
    ("desired", "running", "now", "expected"),
    [case[1:] for case in RULES],
    ids=[case[0] for case in RULES],
)
def test_planner_rules(
    desired: DesiredJob | None, running: JobView | None, now: float, expected: list[Action]
) -> None:
    assert plan_one(desired, running, now) == expected


def test_actions_come_sorted_by_job_and_plan_is_deterministic() -> None:
    desired = {name: want(name) for name in ("zeta", "alpha", "mid")}
    running = {"old": view("old", gpus=(7,))}
    actions = plan(desired, running, T0)
    assert [a.job for a in actions] == ["alpha", "mid", "old", "zeta"]
    assert plan(desired, running, T0) == actions


def test_a_crash_loop_gives_up_exactly_once() -> None:
    runtime = view(exit_codes=(1, 143), crash_restarts=3)
    assert [type(a) for a in plan_one(want(), runtime)] == [GiveUp]
    assert plan_one(want(), dataclasses.replace(runtime, phase=GaveUp())) == []


@pytest.mark.parametrize(
    ("restarts", "expected"),
    [(0, 2.0), (1, 4.0), (2, 8.0), (3, 16.0), (4, 30.0), (60, 30.0), (10_000, 30.0)],
)
def test_crash_backoff_doubles_from_base_up_to_the_cap(restarts: int, expected: float) -> None:
    assert crash_backoff(restarts, 2.0, 30.0) == expected


def test_crash_backoff_without_a_base_restarts_at_once() -> None:
    assert crash_backoff(5, 0.0, 30.0) == 0.0


@pytest.mark.parametrize(
    ("on_change", "expected"),
    [
        ("signal:SIGHUP", int(signal.SIGHUP)),
        ("signal:SIGUSR1", int(signal.SIGUSR1)),
        ("signal:HUP", None),
        ("restart", None),
        ("none", None),
    ],
)
def test_change_signal_reads_signal_names(on_change: str, expected: int | None) -> None:
    assert change_signal(on_change) == expected


def test_an_unknown_on_change_restarts() -> None:
    changed = want(fingerprint="fp-2", on_change="signal:NOPE")
    assert plan_one(changed, view()) == [Stop("train", "assignment changed", 5.0)]


# --- property: plan + an in-memory supervisor converge, never doubling workers -----------


@dataclasses.dataclass
class FakeRuntime:
    """What a supervisor tracks for one job, reduced to what plan() reads."""

    fingerprint: str
    exit_codes: list[int | None]
    gpus: tuple[int, ...]
    device: Literal["cuda", "cpu"]
    grace_seconds: float
    started_at: float
    stopping: bool = False
    crash_restarts: int = 0
    change_restarts: int = 0
    next_restart_at: float | None = None
    gave_up: bool = False
    assignment_revision: int = 0

    @property
    def alive(self) -> int:
        return sum(code is None for code in self.exit_codes)

    def view(self, job: str) -> JobView:
        return JobView(
            job=job,
            fingerprint=self.fingerprint,
            alive=self.alive,
            phase=phase_of(self.stopping, self.gave_up, self.next_restart_at, self.started_at),
            exit_codes=tuple(self.exit_codes),
            crash_restarts=self.crash_restarts,
            change_restarts=self.change_restarts,
            gpus=self.gpus,
            device=self.device,
            grace_seconds=self.grace_seconds,
            assignment_revision=self.assignment_revision,
        )


class FakeSupervisor:
    """Carries out actions in memory, asserting the planner's promises as it goes."""

    def __init__(self) -> None:
        self.runtimes: dict[str, FakeRuntime] = {}

    def views(self) -> dict[str, JobView]:
        return {job: rt.view(job) for job, rt in self.runtimes.items()}

    def apply(self, action: Action, now: float) -> None:
        runtime = self.runtimes.get(action.job)
        if isinstance(action, Start):
            self._start(action, runtime, now)
            return
        assert runtime is not None, f"{action} for a job with no runtime"
        if isinstance(action, Stop):
            assert runtime.alive > 0 and not runtime.stopping, f"needless {action}"
            runtime.stopping = True
        elif isinstance(action, SignalJob | Accept):
            assert runtime.alive > 0 and not runtime.stopping, f"{action} with nothing to tell"
            runtime.fingerprint = action.fingerprint
        elif isinstance(action, Confirm):
            assert runtime.alive > 0 and not runtime.stopping, f"{action} of no running workers"
            assert runtime.assignment_revision != action.revision, f"needless {action}"
            runtime.assignment_revision = action.revision
        elif isinstance(action, ScheduleRestart):
            assert runtime.next_restart_at is None, f"rescheduled: {action}"
            runtime.next_restart_at = action.at
        elif isinstance(action, GiveUp):
            assert not runtime.gave_up and runtime.alive == 0, f"gave up twice: {action}"
            runtime.gave_up = True
        else:
            assert runtime.alive == 0 and not runtime.stopping, f"forgot a live job: {action}"
            del self.runtimes[action.job]

    def _start(self, action: Start, old: FakeRuntime | None, now: float) -> None:
        # The promise under test: never a second set of workers beside live ones.
        if old is not None:
            assert old.alive == 0 and not old.stopping, f"{action} while old workers live"
        assert (old is None) == (action.cause == "new"), f"{action} against runtime {old}"
        if old is not None and action.cause == "change":
            assert old.fingerprint != action.spec.fingerprint, f"{action}: nothing changed"
        if old is not None and action.cause == "crash":
            self._check_crash_restart(action, old, now)
        # Nor beside another job's workers that are on their way out of the same GPUs.
        for other, runtime in self.runtimes.items():
            if other != action.job and runtime.stopping and action.spec.device == "cuda":
                overlap = set(runtime.gpus) & set(action.spec.gpus)
                assert not overlap, f"{action} while {other} still stops on GPUs {overlap}"
        spec = action.spec
        crashes = old.crash_restarts + 1 if old is not None and action.cause == "crash" else 0
        changes = old.change_restarts if old is not None else 0
        self.runtimes[action.job] = FakeRuntime(
            fingerprint=spec.fingerprint,
            exit_codes=[None] * max(len(spec.gpus), 1),
            gpus=spec.gpus,
            device=spec.device,
            grace_seconds=spec.grace_seconds,
            started_at=now,
            crash_restarts=crashes,
            change_restarts=changes + (action.cause == "change"),
            assignment_revision=spec.assignment_revision,
        )

    @staticmethod
    def _check_crash_restart(action: Start, old: FakeRuntime, now: float) -> None:
        """A crash restart: same spec, a worker really crashed, backoff served, limit not hit."""
        assert old.fingerprint == action.spec.fingerprint, f"{action}: a change, not a crash"
        assert any(code != 0 for code in old.exit_codes), f"{action} of a finished job"
        assert old.next_restart_at is not None and now >= old.next_restart_at, f"early {action}"
        assert not old.gave_up, f"{action} after giving up"
        assert old.crash_restarts < action.spec.max_restarts, f"{action} past max_restarts"


JOBS = st.sampled_from(["a", "b"])
STATES: tuple[DesiredState, ...] = ("run", "run", "run", "wait", "failed", "undeclared")


@st.composite
def desired_job_strategy(draw: st.DrawFn, job: str) -> DesiredJob:
    """A desired job whose fingerprint, like a real one, changes with its GPUs."""
    device: Literal["cuda", "cpu"] = draw(st.sampled_from(["cuda", "cuda", "cpu"]))
    gpus = () if device == "cpu" else draw(st.sampled_from([(0,), (1,), (0, 1)]))
    command = draw(st.sampled_from(["v1", "v2"]))
    return want(
        job,
        f"{command}:{gpus}:{device}",
        state=draw(st.sampled_from(STATES)),
        on_change=draw(st.sampled_from(["restart", "none", "signal:SIGHUP"])),
        gpus=gpus,
        device=device,
        max_restarts=draw(st.integers(0, 2)),
        backoff_base=draw(st.sampled_from([0.0, 1.0, 4.0])),
        backoff_max=8.0,
        message="not now",
    )


class PlannerMachine(RuleBasedStateMachine):
    """Operators change what is desired, workers exit, time passes; plan() keeps up."""

    def __init__(self) -> None:
        super().__init__()
        self.desired: dict[str, DesiredJob] = {}
        self.supervisor = FakeSupervisor()
        self.now = T0

    @rule(data=st.data(), job=JOBS)
    def operator_sets(self, data: st.DataObject, job: str) -> None:
        self.desired[job] = data.draw(desired_job_strategy(job))

    @rule(job=JOBS)
    def operator_releases(self, job: str) -> None:
        self.desired.pop(job, None)

    @rule(job=JOBS, index=st.integers(0, 1), code=st.sampled_from([0, 1, 137]))
    def worker_exits(self, job: str, index: int, code: int) -> None:
        runtime = self.supervisor.runtimes.get(job)
        if runtime is not None and runtime.exit_codes[index:] and runtime.exit_codes[index] is None:
            runtime.exit_codes[index] = code

    @rule(job=JOBS, code=st.sampled_from([0, 1, 139]))
    def every_worker_exits(self, job: str, code: int) -> None:
        runtime = self.supervisor.runtimes.get(job)
        if runtime is not None:
            runtime.exit_codes = [code if c is None else c for c in runtime.exit_codes]

    @rule(job=JOBS)
    def stop_completes(self, job: str) -> None:
        runtime = self.supervisor.runtimes.get(job)
        if runtime is not None and runtime.stopping:
            runtime.exit_codes = [143 if c is None else c for c in runtime.exit_codes]
            runtime.stopping = False

    @rule(seconds=st.sampled_from([0.5, 3.0, 10.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def reconcile(self) -> None:
        """Plan and apply until plan() has nothing more to say."""
        for _ in range(5):
            actions = plan(self.desired, self.supervisor.views(), self.now)
            if not actions:
                return
            jobs = [action.job for action in actions]
            assert len(jobs) == len(set(jobs)), f"two actions for one job: {actions}"
            for action in actions:
                self.supervisor.apply(action, self.now)
            again = plan(self.desired, self.supervisor.views(), self.now)
            assert not set(actions) & set(again), f"repeated work: {actions} then {again}"
        raise AssertionError("plan() did not settle in 5 rounds")

    @invariant()
    def plan_is_deterministic(self) -> None:
        views = self.supervisor.views()
        assert plan(self.desired, views, self.now) == plan(self.desired, views, self.now)

    @invariant()
    def settled_state_matches_what_is_desired(self) -> None:
        if plan(self.desired, self.supervisor.views(), self.now):
            return  # not reconciled yet
        for job, runtime in self.supervisor.runtimes.items():
            wanted = self.desired.get(job)
            if wanted is None or wanted.state != "run":
                # Settled means Forget already ran for a gone runtime: only a stop can remain.
                assert runtime.stopping, (job, runtime)
            elif not runtime.stopping and not self._held_back(job, wanted):
                assert runtime.fingerprint == wanted.fingerprint, (job, runtime, wanted)
        for job, wanted in self.desired.items():
            if wanted.state == "run" and not self._held_back(job, wanted):
                assert job in self.supervisor.runtimes, f"{job} desired but not started"

    def _held_back(self, job: str, wanted: DesiredJob) -> bool:
        """Whether another job's workers are still stopping on one of ``job``'s GPUs."""
        return wanted.device == "cuda" and any(
            other != job and rt.stopping and rt.device == "cuda" and set(rt.gpus) & set(wanted.gpus)
            for other, rt in self.supervisor.runtimes.items()
        )


PlannerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPlannerConverges = PlannerMachine.TestCase


def test_a_start_waits_while_another_jobs_workers_still_stop_on_its_gpus() -> None:
    # "old" was released from GPU 1 and ignores SIGTERM; "new" was just given GPU 1.
    desired = {"new": want("new", gpus=(1,))}
    stopping = {"old": view("old", gpus=(1,), exit_codes=(None,), stopping=True)}
    assert plan(desired, stopping, T0) == []
    released = {"old": view("old", gpus=(1,), exit_codes=(None,))}
    assert plan(desired, released, T0) == [Stop("old", "assignment released", 7.0)]
    gone = {"old": view("old", gpus=(1,), exit_codes=(-1,), alive=0)}
    assert plan(desired, gone, T0) == [Start("new", desired["new"], "new"), Forget("old")]


def test_starts_on_other_gpus_or_on_cpu_are_not_held() -> None:
    stopping = {"old": view("old", gpus=(1,), exit_codes=(None,), stopping=True)}
    other_gpu = {"new": want("new", gpus=(2,))}
    assert plan(other_gpu, stopping, T0) == [Start("new", other_gpu["new"], "new")]
    on_cpu = {"new": want("new", gpus=(), device="cpu")}
    assert plan(on_cpu, stopping, T0) == [Start("new", on_cpu["new"], "new")]
