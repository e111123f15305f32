"""Idle holders: jobs that hold GPUs and do not use them (pure; time passed in).

On every usage sample the agent feeds :class:`IdleTracker` the GPUs each
running job holds and each GPU's utilization. A job is idle from the first
sample where all its GPUs were under the threshold, and busy again at the
first sample where one was not. A GPU NVML cannot measure, a GPU out of
service, a job not running on its GPUs (waiting, in its CPU fallback), or
no sample at all is never idle: only measured idleness counts, so nothing
is released on a guess.

What is published (the worker record's ``idle_since``) changes only when a
job goes idle or busy, and only once it has been idle for
:data:`PUBLISH_AFTER_SECONDS` (or its rule's ``after``, if shorter): a job
between two batches of work does not rewrite its record on every sample.

:func:`idle_actions` turns idle times and the policy's rules into what to do:
warn (once per idle spell) and release (handed to the store link, which
releases only the assignment that was judged, so an operator's concurrent
``set`` wins).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from allocator.agent.planning.types import IdleRelease
from allocator.gpus.usage import GpuUsage
from allocator.policy.model import IdleRule
from allocator.util.durations import format_duration
from allocator.util.times import format_time

__all__ = [
    "DEFAULT_THRESHOLD_PERCENT",
    "PUBLISH_AFTER_SECONDS",
    "IdleActions",
    "IdleTracker",
    "idle_actions",
    "release_reason",
]

#: The threshold for jobs without an idle rule (their idle time is still shown).
DEFAULT_THRESHOLD_PERCENT = 5.0
#: How long a job is idle before its ``idle_since`` is published.
PUBLISH_AFTER_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class _Spell:
    started: float  # monotonic
    started_wall: datetime


class IdleTracker:
    """When each job's GPUs went idle, from one usage sample to the next."""

    def __init__(self) -> None:
        self._spells: dict[str, _Spell] = {}

    def update(
        self,
        jobs: Mapping[str, Sequence[int]],
        usage: Sequence[GpuUsage] | None,
        thresholds: Mapping[str, float],
        now: float,
        wall: datetime,
    ) -> None:
        """Take one sample: ``jobs`` maps each job running on GPUs to those GPUs.

        ``usage`` is ``None`` when NVML gave no sample (every spell ends);
        ``thresholds`` is each job's percentage (default
        :data:`DEFAULT_THRESHOLD_PERCENT`); ``now`` is the monotonic clock and
        ``wall`` the same moment in UTC.
        """
        by_gpu = {u.index: u for u in usage} if usage is not None else {}
        spells: dict[str, _Spell] = {}
        for job, gpus in jobs.items():
            threshold = thresholds.get(job, DEFAULT_THRESHOLD_PERCENT)
            if gpus and all(_idle(by_gpu.get(gpu), threshold) for gpu in gpus):
                spells[job] = self._spells.get(job) or _Spell(now, wall)
        self._spells = spells

    def idle_seconds(self, now: float) -> dict[str, float]:
        """How long each idle job has been idle at ``now``."""
        return {job: max(0.0, now - spell.started) for job, spell in self._spells.items()}

    def published(self, now: float, after: Mapping[str, float] | None = None) -> dict[str, str]:
        """``idle_since`` (RFC 3339) of each job idle long enough to say so.

        That is :data:`PUBLISH_AFTER_SECONDS`, or the job's ``after`` in
        ``after`` (its idle rule's) when shorter.
        """
        limits = after or {}
        return {
            job: format_time(spell.started_wall)
            for job, spell in sorted(self._spells.items())
            if now - spell.started >= min(PUBLISH_AFTER_SECONDS, limits.get(job, math.inf))
        }

    def started_wall(self, job: str) -> datetime | None:
        """When ``job``'s current idle spell began (UTC), if it is idle."""
        spell = self._spells.get(job)
        return spell.started_wall if spell else None


def _idle(usage: GpuUsage | None, threshold: float) -> bool:
    return (
        usage is not None
        and not usage.error
        and usage.utilization_percent is not None
        and usage.utilization_percent < threshold
    )


@dataclass(frozen=True, slots=True)
class IdleActions:
    """What the idle rules ask for after one sample."""

    warn: tuple[tuple[str, str], ...] = ()  # (job, reason) newly past a warn rule
    release: tuple[IdleRelease, ...] = ()


def release_reason(idle_seconds: float, source: str) -> str:
    """``idle for 2h03m (policy idle rule on pool a100)``."""
    return f"idle for {format_duration(idle_seconds)} (policy idle rule on {source})"


def idle_actions(
    idle: Mapping[str, float],
    rules: Mapping[str, tuple[IdleRule, str]],
    revisions: Mapping[str, int],
    warned: set[str],
) -> IdleActions:
    """Warnings and releases due: each idle job past its rule's ``after``.

    ``rules`` maps jobs to their rule in force and where it comes from
    (:meth:`Policy.idle_rule`); ``warned`` are the jobs already warned about
    in their current idle spell (updated in place: jobs no longer idle leave it).
    """
    warned.intersection_update(idle)
    warn: list[tuple[str, str]] = []
    release: list[IdleRelease] = []
    for job, seconds in sorted(idle.items()):
        found = rules.get(job)
        if found is None:
            continue
        rule, source = found
        if rule.after_seconds is None or seconds < rule.after_seconds:
            continue
        reason = release_reason(seconds, source)
        if rule.action == "release" and job in revisions:
            release.append(IdleRelease(job, revisions[job], reason))
        elif rule.action == "warn" and job not in warned:
            warned.add(job)
            warn.append((job, reason))
    return IdleActions(tuple(warn), tuple(release))
