"""Time limits: how long a job may hold its GPUs, and when it must end.

One place for every path that starts a job (``set``, ``run``, ``submit``,
the agent): the limit a request gets from the pool's default and maximum,
the absolute end time stored in the assignment, and whether that end has
come. Pure: the caller passes the clock, so the agent's planner and the
tests decide with the same code.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from allocator.errors import RequestError
from allocator.util.durations import duration_text, format_duration, parse_duration
from allocator.util.times import format_time, parse_time

__all__ = ["end_time", "limit_reached", "resolve_limit", "seconds_left", "time_left_text"]


def resolve_limit(
    requested: str | None, pool: str, default: float | None, maximum: float | None
) -> float | None:
    """Seconds the job may run: ``requested`` (``time=2h``), else the pool default; ``None``: none.

    A request above the pool's maximum is refused (exit 2) with one line naming
    the maximum, so nothing is written for it.
    """
    if requested is None:
        return default
    try:
        seconds = parse_duration(requested)
    except ValueError as exc:
        raise RequestError(f"time={requested}: {exc}") from None
    if seconds <= 0:
        raise RequestError(f"time={requested}: a time limit must be above zero")
    if maximum is not None and seconds > maximum:
        raise RequestError(
            f"time={requested} is above the maximum of pool {pool}: {duration_text(maximum)}"
        )
    return seconds


def end_time(start: datetime, seconds: float | None) -> str:
    """The assignment's end time as stored (RFC 3339 UTC); ``""`` without a limit.

    Stored times are to the second: the end is rounded up, so a job gets at
    least the time it was given (``time=2s`` never ends after 1.2 seconds).
    """
    if seconds is None:
        return ""
    end = start + timedelta(seconds=seconds)
    if end.microsecond:
        end = end.replace(microsecond=0) + timedelta(seconds=1)
    return format_time(end)


def seconds_left(end: str, now: datetime) -> float | None:
    """Seconds until the stored ``end`` (0 once passed); ``None`` for no (or an unreadable) end."""
    moment = parse_time(end) if end else None
    if moment is None:
        return None
    return max(0.0, (moment - now).total_seconds())


def limit_reached(end: str, now: datetime) -> bool:
    """Whether the job must stop now: its stored end time has come."""
    return seconds_left(end, now) == 0.0


def time_left_text(end: str, now: datetime) -> str:
    """What ``status`` and ``get`` show of a limit: ``1h29m``, ``0s`` once passed; ``""``: none."""
    left = seconds_left(end, now)
    return "" if left is None else format_duration(left)
