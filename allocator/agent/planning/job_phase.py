"""A supervised job's life as one state machine: its phases, the events that move it, the table.

The supervisor moves a job only through :func:`next_phase`, so which event
may move which phase to which is written once, here, and a move the table
does not list is refused (a bug, which the supervisor logs) instead of
leaving the job in a state nobody planned for.

Phases are what the supervisor decides; how far its workers got is read
from the workers themselves. So a job whose workers all ended by themselves
is still ``RUNNING`` (published as ``exited`` when they all exited 0, else
``stopped``: see :func:`published_state`) until the planner judges the end
by the job's ``restart`` and ``release_on_exit`` rules: ``FINISHED`` (done,
never started again as it is) or a crash (restarted, or ``GAVE_UP`` once the
crash loop reaches its limit). Finished and gave up are different ends: the
first is the job's own (exit 0, or any exit under ``restart: never``), the
second the agent's verdict on a crash loop. There is no "starting" phase: a
start launches every worker before the loop goes on (the shim reports the
main pid later, but the job is running from the launch), and a job that
waits for a GPU, a reservation or its MPS daemon has no workers and so no
phase at all: the planner holds it back before the supervisor sees it.
The one wait the supervisor itself decides is ``WAITING``: a start it could
not record (state file or status file unwritable, a full disk) launches
nothing, since a worker no later agent could find would run twice.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "TRANSITIONS",
    "BackingOff",
    "Crashed",
    "Finished",
    "GaveUp",
    "JobEvent",
    "JobPhase",
    "JobState",
    "Running",
    "Stopped",
    "Stopping",
    "Waiting",
    "next_phase",
    "phase_record",
    "published_state",
]


class JobPhase(enum.Enum):
    """Where a supervised job is in its life."""

    RUNNING = "running"  # workers launched (or adopted); none crashed, no stop ordered
    STOPPING = "stopping"  # the agent ordered a stop: SIGTERM sent, SIGKILL after the grace
    CLEARING = "clearing"  # a worker crashed: the others are being stopped before a restart
    STOPPED = "stopped"  # the agent's stop finished: every tree is gone, and no crash
    CRASHED = "crashed"  # a worker crashed; no restart scheduled (yet)
    BACKOFF = "backoff"  # crashed, every tree gone, a restart scheduled
    GAVE_UP = "gave-up"  # the crash-loop limit was reached: no restart until the spec changes
    WAITING = "waiting"  # a start could not be recorded: nothing launched, tried again later
    FINISHED = "finished"  # the workers ended and the job's rules say it is done: no restart

    @property
    def stopping(self) -> bool:
        """Whether a stop is under way (SIGTERM sent, SIGKILL due at the deadline)."""
        return self in (JobPhase.STOPPING, JobPhase.CLEARING)


class JobEvent(enum.Enum):
    """What happens to a job: the supervisor's actions and what its workers do."""

    START = "start"  # new workers replace whatever is left of the old (none alive)
    STOP = "stop"  # SIGTERM to every tree
    STOP_DONE = "stop-done"  # every tree of a stop is gone
    CRASH = "crash"  # a worker ended by itself with a non-zero code
    SCHEDULE_RESTART = "schedule-restart"  # a crash restart is due at a time
    GIVE_UP = "give-up"  # the crash-loop limit was reached
    ACCEPT = "accept"  # a new spec was taken on without a restart (on_change none/signal)
    HOLD = "hold"  # a start could not be recorded before any launch: nothing was started
    FINISH = "finish"  # every worker ended and the job's rules say it is done


_P = JobPhase
_E = JobEvent
_ANY = tuple(JobPhase)
_NOT_STOPPING = tuple(p for p in JobPhase if not p.stopping)

#: (phase, event) -> the phase it moves to. Anything not listed is refused.
TRANSITIONS: Mapping[tuple[JobPhase, JobEvent], JobPhase] = {
    # A start is never made while a stop is under way (the planner waits for the trees).
    **{(p, _E.START): _P.RUNNING for p in _NOT_STOPPING},
    # Live processes can always be stopped; a stop after a crash remembers the crash.
    (_P.RUNNING, _E.STOP): _P.STOPPING,
    (_P.STOPPED, _E.STOP): _P.STOPPING,
    (_P.CRASHED, _E.STOP): _P.CLEARING,
    (_P.BACKOFF, _E.STOP): _P.CLEARING,
    (_P.GAVE_UP, _E.STOP): _P.CLEARING,
    (_P.STOPPING, _E.STOP_DONE): _P.STOPPED,
    (_P.CLEARING, _E.STOP_DONE): _P.CRASHED,
    # Only the first crash of a set of workers counts; an exit during a stop is never one.
    (_P.RUNNING, _E.CRASH): _P.CRASHED,
    (_P.CRASHED, _E.CRASH): _P.CRASHED,
    (_P.BACKOFF, _E.CRASH): _P.BACKOFF,
    (_P.GAVE_UP, _E.CRASH): _P.GAVE_UP,
    (_P.CRASHED, _E.SCHEDULE_RESTART): _P.BACKOFF,
    (_P.BACKOFF, _E.SCHEDULE_RESTART): _P.BACKOFF,
    # Workers gone without an exit code (adopted ones are not the agent's children):
    # the planner restarts them as after a crash, the supervisor cannot call it one.
    (_P.RUNNING, _E.SCHEDULE_RESTART): _P.RUNNING,
    (_P.RUNNING, _E.GIVE_UP): _P.GAVE_UP,
    # A start whose workers cannot be recorded launches none of them.
    (_P.RUNNING, _E.HOLD): _P.WAITING,
    (_P.CRASHED, _E.GIVE_UP): _P.GAVE_UP,
    # Every worker ended by itself (or, after a crash, was cleared) and the job's
    # restart/release_on_exit rules say it is done; only a new start moves it on.
    (_P.RUNNING, _E.FINISH): _P.FINISHED,
    (_P.CRASHED, _E.FINISH): _P.FINISHED,
    (_P.BACKOFF, _E.FINISH): _P.FINISHED,  # the policy's restart rule changed meanwhile
    (_P.BACKOFF, _E.GIVE_UP): _P.GAVE_UP,
    # A new spec ends a crash loop's verdict (it may well fix the crash) and its backoff.
    **{(p, _E.ACCEPT): p for p in _ANY},
    (_P.BACKOFF, _E.ACCEPT): _P.CRASHED,
    (_P.GAVE_UP, _E.ACCEPT): _P.CRASHED,
}


def next_phase(phase: JobPhase, event: JobEvent) -> JobPhase | None:
    """The phase ``event`` moves ``phase`` to, or None when the table refuses the move."""
    return TRANSITIONS.get((phase, event))


def published_state(phase: JobPhase, alive: int, exit_codes: Sequence[int | None]) -> str:
    """The worker state the agent publishes for a job in ``phase``.

    One of running, stopping, crashed, backoff, gave-up, waiting, finished, exited, stopped.
    ``alive`` counts the workers whose trees still have processes; a job the
    agent did not stop reads from its workers: running while any is alive,
    exited when all of them exited 0, stopped otherwise.
    """
    if phase.stopping:
        return "stopping"
    if phase in (
        JobPhase.CRASHED,
        JobPhase.BACKOFF,
        JobPhase.GAVE_UP,
        JobPhase.WAITING,
        JobPhase.FINISHED,
    ):
        return str(phase.value)
    if alive > 0:
        return "running"
    if all(code == 0 for code in exit_codes):
        return "exited"
    return "stopped"


# --- the phase as the planner reads it: one record per phase, with its own timer ---------


@dataclass(frozen=True, slots=True)
class Running:
    """Workers launched (or adopted) at ``since``; no stop ordered, no crash noted.

    Its workers may all have ended by themselves: the planner judges that end.
    """

    since: float


@dataclass(frozen=True, slots=True)
class Stopping:
    """A stop is under way: SIGTERM sent, SIGKILL at ``deadline``.

    ``after_crash``: the stop clears the rest of a crashed set (CLEARING).
    """

    deadline: float | None
    after_crash: bool = False


@dataclass(frozen=True, slots=True)
class Stopped:
    """The agent's stop finished and nothing of the workers is left: no crash."""


@dataclass(frozen=True, slots=True)
class Crashed:
    """A worker crashed; no restart is scheduled yet."""


@dataclass(frozen=True, slots=True)
class BackingOff:
    """The workers are gone and a restart is due at ``until`` (monotonic)."""

    until: float


@dataclass(frozen=True, slots=True)
class GaveUp:
    """The crash-loop limit was reached: nothing starts until the spec changes."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A start could not be recorded: nothing was launched; it is tried again at ``until``."""

    until: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The workers ended and the job's rules say it is done: never started again as is."""


JobState = Running | Stopping | Stopped | Crashed | BackingOff | GaveUp | Waiting | Finished


def phase_record(
    phase: JobPhase,
    *,
    alive: int,
    started_at: float,
    stop_deadline: float | None,
    restart_at: float | None,
    retry_at: float | None,
) -> JobState:
    """The planner's record of a job in ``phase``, carrying that phase's own timer.

    A restart that was scheduled before a stop (or for adopted workers gone
    without an exit code) is still due: such a job is :class:`BackingOff`
    whatever the table calls it, since a restart time is all the planner
    waits on.
    """
    if phase.stopping:
        return Stopping(stop_deadline, after_crash=phase is JobPhase.CLEARING)
    if phase is JobPhase.GAVE_UP:
        return GaveUp()
    if phase is JobPhase.FINISHED:
        return Finished()
    if phase is JobPhase.WAITING:
        return Waiting(0.0 if retry_at is None else retry_at)
    if phase is JobPhase.STOPPED and alive == 0:
        return Stopped()
    if restart_at is not None:
        return BackingOff(restart_at)
    if phase in (JobPhase.CRASHED, JobPhase.BACKOFF):
        return Crashed()
    # RUNNING (and a STOPPED job with live processes, which no move makes).
    return Running(started_at)
