"""Jobs whose time limit has come: the releases the agent hands its store link.

An assignment written with an ``ends_at`` (``set time=``, or the pool's
``default_time``) is released at that time with the reason ``time limit``;
the release then stops its workers as any release does (SIGTERM, the job's
grace, SIGKILL of the whole tree). A holding of a process (``allocator
run``, ``lease()``, a submitted job) is left to that process: it stops its
own command at the limit and releases with the command's exit status.

Pure: the caller passes the wall clock, so the loop and the tests decide
with the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from allocator.agent.planning.types import IdleRelease
from allocator.placement.time_limit import limit_reached, seconds_left
from allocator.records.types import Assignment

__all__ = ["LIMIT_REASON", "limit_releases", "next_limit_in"]

#: The history reason of a release at the time limit (``run`` and ``submit`` use it too).
LIMIT_REASON = "time limit"


def _agents(assignments: Mapping[str, Assignment]) -> list[Assignment]:
    """The assignments whose limit is the agent's to keep: limited, held by no process."""
    return [a for a in assignments.values() if a.ends_at and a.run is None]


def limit_releases(
    assignments: Mapping[str, Assignment], revisions: Mapping[str, int], now: datetime
) -> list[IdleRelease]:
    """The releases due at ``now``: each at the revision whose ``ends_at`` has passed."""
    return [
        IdleRelease(a.job, revisions[a.job], LIMIT_REASON, kind="time-limit")
        for a in _agents(assignments)
        if a.job in revisions and limit_reached(a.ends_at, now)
    ]


def next_limit_in(assignments: Mapping[str, Assignment], now: datetime) -> float | None:
    """Seconds until the earliest limit still to come (the loop wakes then); ``None``: none."""
    left = [seconds_left(a.ends_at, now) for a in _agents(assignments)]
    waits = [s for s in left if s is not None and s > 0]
    return min(waits) if waits else None
