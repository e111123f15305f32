"""The agent's planner: desired jobs + what runs now -> actions for the supervisor.

Pure and level-based: ``plan`` looks only at its inputs, never at what it
returned last time, so calling it again after the actions were applied yields
no duplicate work. Two guarantees the supervisor relies on: a job is never
started while any of its old process groups is alive or stopping, and a
crash-looping job is given up exactly once, until its fingerprint changes.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

from allocator.agent.planning.exit_codes import UNKNOWN_EXIT, describe_exit
from allocator.agent.planning.job_phase import (
    BackingOff,
    Finished,
    GaveUp,
    Stopped,
    Stopping,
    Waiting,
)
from allocator.agent.planning.types import (
    Accept,
    Action,
    Confirm,
    DesiredJob,
    Finish,
    Forget,
    GiveUp,
    JobView,
    ScheduleRestart,
    SignalJob,
    Start,
    Stop,
)

__all__ = ["change_signal", "crash_backoff", "job_status", "plan", "restarts_after"]


def plan(
    desired: Mapping[str, DesiredJob], running: Mapping[str, JobView], now: float
) -> list[Action]:
    """Return what to do, sorted by job, to move ``running`` towards ``desired``.

    ``now`` is the monotonic time that the timers of each ``JobView.phase`` are measured in.
    """
    actions: list[Action] = []
    for job in sorted(desired.keys() | running.keys()):
        actions.extend(_plan_job(job, desired.get(job), running.get(job), now))
    busy = _gpus_still_held(running, actions)
    return [a for a in actions if not _starts_on_busy_gpus(a, busy)]


def _gpus_still_held(running: Mapping[str, JobView], actions: list[Action]) -> dict[int, str]:
    """GPUs whose process groups are going away but are not gone yet (GPU -> job)."""
    stopping_now = {a.job for a in actions if isinstance(a, Stop)}
    held: dict[int, str] = {}
    for job, view in running.items():
        leaving = isinstance(view.phase, Stopping) or (job in stopping_now and view.alive > 0)
        if view.device == "cuda" and leaving:
            for gpu in view.gpus:
                held[gpu] = job
    return held


def _starts_on_busy_gpus(action: Action, busy: Mapping[int, str]) -> bool:
    """Hold a Start while another job's old workers still run on one of its GPUs.

    A GPU handed from one job to another must be free of the first job's
    processes (and their CUDA contexts and memory) before the second starts.
    """
    if not isinstance(action, Start) or action.spec.device != "cuda":
        return False
    return any(busy.get(gpu, action.job) != action.job for gpu in action.spec.gpus)


def crash_backoff(crash_restarts: int, base: float, cap: float) -> float:
    """Seconds to wait before crash restart number ``crash_restarts + 1``: base * 2**n, capped.

    Deterministic; a caller that wants jitter adds it.
    """
    if base <= 0:
        return 0.0
    # Compare exponents rather than computing 2**n: a long crash loop would overflow a float.
    doublings = max(crash_restarts, 0)
    if doublings >= 64 or base * 2.0**doublings >= cap:
        return max(cap, 0.0)
    return base * 2.0**doublings


def change_signal(on_change: str) -> int | None:
    """The signal number of ``signal:<SIGNAME>``, or None for restart/none/unknown words."""
    if not on_change.startswith("signal:"):
        return None
    name = on_change.removeprefix("signal:")
    member = signal.Signals.__members__.get(name)
    return int(member) if member is not None else None


def _plan_job(job: str, want: DesiredJob | None, view: JobView | None, now: float) -> list[Action]:
    if want is None or want.state != "run":
        return [] if view is None else _retire(view, want)
    if view is None:
        return [Start(job, want, "new")]
    if view.fingerprint != want.fingerprint:
        return _change(want, view)
    return _same_spec(want, view, now)


def _retire(view: JobView, want: DesiredJob | None) -> list[Action]:
    """Rule 1: the job should not run; stop its workers, then forget it."""
    if isinstance(view.phase, Stopping):
        return []
    if view.alive == 0:
        return [Forget(view.job)]
    if want is None:
        return [Stop(view.job, "assignment released", view.grace_seconds)]
    # An undeclared job has no policy grace of its own; keep the one it was started with.
    grace = view.grace_seconds if want.state == "undeclared" else want.grace_seconds
    return [Stop(view.job, want.message or f"job is {want.state}", grace)]


def _change(want: DesiredJob, view: JobView) -> list[Action]:
    """Rule 3: the spec changed; restart, signal or accept as the job's on_change says."""
    moved = (view.gpus, view.device) != (want.gpus, want.device)
    signum = change_signal(want.on_change)
    # Signal/accept need live workers to hand the change to; with none left, or a
    # stop already under way, the new spec can only take effect by starting it.
    in_place = view.alive > 0 and not isinstance(view.phase, Stopping) and not moved
    if in_place and signum is not None:
        return [SignalJob(want.job, signum, want.fingerprint)]
    if in_place and want.on_change == "none":
        return [Accept(want.job, want.fingerprint)]
    return _replace(want, view)


def _replace(want: DesiredJob, view: JobView) -> list[Action]:
    """Stop the old workers, wait until every group is gone, then start ``want``."""
    if isinstance(view.phase, Stopping):
        return []
    if view.alive > 0:
        return [Stop(want.job, "assignment changed", want.grace_seconds)]
    return [Start(want.job, want, "change")]


def _same_spec(want: DesiredJob, view: JobView, now: float) -> list[Action]:
    """Rule 4: the workers run the desired spec; handle crashes and finished jobs."""
    phase = view.phase
    if isinstance(phase, Waiting):  # nothing ran: no crash, no restart to count
        return [Start(want.job, want, "new")] if now >= phase.until else []
    if isinstance(phase, Finished) and want.assignment_revision != view.assignment_revision:
        return [Start(want.job, want, "new")]  # set again after it finished: a new run
    if isinstance(phase, Stopping | GaveUp | Finished):
        return []
    if isinstance(phase, Stopped):
        # The agent stopped them (released and set again, a "wait" GPU back, ...)
        # and they are gone: that was no crash, so start them again at once.
        return [Start(want.job, want, "change")]
    crash = _crash(view)
    if view.alive > 0:
        # One worker's crash ends the set (a collective misses a rank); one that
        # finished waits for the others.
        if crash is not None:
            return [Stop(want.job, f"worker crashed: {crash}", want.grace_seconds)]
        return _confirm(want, view)
    status = job_status(view)
    end = _end(want, status)
    if end is not None:
        return [end]
    return _restart(want, view, crash or f"workers exited with {describe_exit(status)}", now)


def _confirm(want: DesiredJob, view: JobView) -> list[Action]:
    """Running workers of the same spec serve an assignment set again: note its revision.

    Only while they run: the job that ends then ended under that assignment,
    so an identical ``set`` never makes a finished job run again, and its
    ``release_on_exit`` releases the revision that holds now.
    """
    # A worker's main process still runs: a set once all have ended (their shims
    # still clearing up) came after the job's end, and runs it anew.
    if want.assignment_revision == view.assignment_revision or None not in view.exit_codes:
        return []
    return [Confirm(want.job, want.assignment_revision)]


def job_status(view: JobView) -> int:
    """The exit status of a job whose workers all ended: its first crash's code, else 0.

    Workers gone without a known code (adopted ones whose shims died) end it
    with :data:`UNKNOWN_EXIT`.
    """
    if view.exit_status is not None and view.exit_status != 0:
        return view.exit_status
    codes = [code for code in view.exit_codes if code is not None]
    if len(codes) < len(view.exit_codes) or not codes:
        return UNKNOWN_EXIT
    return next((code for code in codes if code != 0), 0)


def restarts_after(rule: str, status: int) -> bool:
    """Whether ``restart: rule`` starts workers again after the job ended with ``status``."""
    if rule == "always":
        return True
    return rule == "on-failure" and status != 0


def _end(want: DesiredJob, status: int) -> Finish | None:
    """The job's end when its rules say it is done (released or kept), else None (restart)."""
    words = f"finished (exit {describe_exit(status)})"
    if status in want.release_on_exit:
        return Finish(want.job, status, True, f"{words}; its GPUs released (release_on_exit)")
    if restarts_after(want.restart, status):
        return None
    return Finish(want.job, status, False, words if status == 0 else f"{words}; restart: never")


def _restart(want: DesiredJob, view: JobView, crash: str, now: float) -> list[Action]:
    """Restart ended workers after the crash backoff, or give up at ``max_restarts``."""
    if view.crash_restarts >= want.max_restarts:
        reason = (
            f"{crash}; gave up after {view.crash_restarts} crash restarts "
            f"(max_restarts {want.max_restarts}); waiting for the assignment or policy to change"
        )
        return [GiveUp(want.job, reason)]
    if not isinstance(view.phase, BackingOff):
        delay = crash_backoff(view.crash_restarts, want.backoff_base, want.backoff_max)
        return [ScheduleRestart(want.job, now + delay)]
    if now >= view.phase.until:
        return [Start(want.job, want, "crash")]
    return []


def _crash(view: JobView) -> str | None:
    """Describe the first crashed worker, or None when no worker crashed.

    Exit 0 is a finished worker, not a crash. Workers that are all gone
    without a known exit code (adopted processes are not the agent's
    children) count as crashed: nothing says the job finished.
    """
    for index, code in enumerate(view.exit_codes):
        if code is not None and code != 0:
            return f"worker {index} exited with {describe_exit(code)}"
    finished = bool(view.exit_codes) and all(code == 0 for code in view.exit_codes)
    if view.alive == 0 and not finished:
        return "workers are gone without an exit code"
    return None
