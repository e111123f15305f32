"""The fleet over time: a bounded series ``allocator serve`` samples from its own counters.

Every ``interval`` seconds :meth:`Series.tick` takes one :class:`Sample`
(GPUs held, idle, free and unhealthy per pool and in all, the queue's
length, the mean GPU utilisation agents report) from counters serve keeps
anyway, so a sample costs a few additions, never a store read. At most
``points`` samples are kept (the oldest go first); nothing is back-filled
from before serve started. Time is passed in.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNTED", "DEFAULT_POINTS", "DEFAULT_SAMPLE_SECONDS", "Sample", "Series"]

#: The counts kept per pool, as ``status --summary`` counts them (``held`` includes
#: the idle GPUs, ``free`` the reserved ones).
COUNTED = ("held", "idle", "free", "unhealthy")

DEFAULT_SAMPLE_SECONDS = 10.0
#: 24 hours of samples at the default interval.
DEFAULT_POINTS = 8640


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one moment (``t``: epoch seconds)."""

    t: float
    pools: Mapping[str, Mapping[str, int]]
    total: Mapping[str, int]
    utilisation_percent: float | None
    queue: int


class Series:
    """At most ``points`` samples, one per ``interval`` seconds; safe to share between threads."""

    def __init__(self, interval: float, points: int) -> None:
        self.interval = interval
        self._samples: deque[Sample] = deque(maxlen=points)
        self._lock = threading.Lock()
        self._last: float | None = None

    def tick(self, now: float, take: Callable[[float], Sample]) -> bool:
        """Take a sample with ``take(now)`` if one is due at ``now``; return whether one was."""
        with self._lock:
            if self._last is not None and now - self._last < self.interval:
                return False
            self._last = now
            self._samples.append(take(now))
            return True

    def due_in(self, now: float) -> float:
        """Seconds until the next sample is due."""
        return 0.0 if self._last is None else max(0.0, self._last + self.interval - now)

    def document(self) -> dict[str, Any]:
        """``/api/v1/series``: the samples column by column (a pool absent at a sample: null)."""
        with self._lock:
            samples = list(self._samples)
        pools = sorted({pool for s in samples for pool in s.pools})
        return {
            "interval_seconds": self.interval,
            "t": [s.t for s in samples],
            "pools": {
                pool: {
                    state: [_count(s.pools.get(pool), state) for s in samples] for state in COUNTED
                }
                for pool in pools
            },
            "total": {state: [s.total.get(state, 0) for s in samples] for state in COUNTED},
            "utilisation_percent": [s.utilisation_percent for s in samples],
            "queue": [s.queue for s in samples],
        }


def _count(counts: Mapping[str, int] | None, state: str) -> int | None:
    return None if counts is None else counts.get(state, 0)
