"""The host's mean GPU utilisation as its agent reports it to the store (pure, time passed in).

Utilisation moves all the time; a fleet whose agents wrote every move
would write thousands of keys a second. The agent reports the mean of
its GPUs that measure one, rounded to :data:`STEP` points, in its counts
record (``counts/<host>``), and changes the reported value at most once per
``interval`` seconds: 12,500 hosts at the default five minutes are some 42
writes a second however busy they are. ``allocator serve`` plots the
fleet's mean from these.
"""

from __future__ import annotations

from collections.abc import Iterable

from allocator.gpus.usage import GpuUsage

__all__ = ["DEFAULT_INTERVAL", "STEP", "UtilisationReport", "mean_utilisation"]

#: Points the reported mean is rounded to.
STEP = 10
#: Seconds between two changes of the reported value.
DEFAULT_INTERVAL = 300.0


def mean_utilisation(usage: Iterable[GpuUsage] | None) -> int | None:
    """The mean utilisation of the GPUs that measure one, rounded to :data:`STEP`; else ``None``."""
    measured = [u.utilization_percent for u in usage or () if u.utilization_percent is not None]
    if not measured:
        return None
    return min(100, STEP * round(sum(measured) / len(measured) / STEP))


class UtilisationReport:
    """The value the agent reports: the rounded mean, changed at most once per ``interval``.

    ``interval`` 0 or less: nothing is reported (``None`` always).
    """

    def __init__(self, interval: float = DEFAULT_INTERVAL) -> None:
        self.interval = interval
        self.value: int | None = None
        self._changed_at: float | None = None

    def update(self, usage: Iterable[GpuUsage] | None, now: float) -> int | None:
        """Take a sample at ``now``; return the value to report."""
        if self.interval <= 0:
            return None
        latest = mean_utilisation(usage)
        if latest == self.value:
            return self.value
        if self._changed_at is None or now - self._changed_at >= self.interval:
            self.value, self._changed_at = latest, now
        return self.value
