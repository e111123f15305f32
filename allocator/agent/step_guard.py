"""Containing bugs: a step of the agent's loop that raises is retried, not fatal.

The agent's loop runs a few steps per tick (read, health, reap, reconcile,
publish). An unexpected exception in one of them is a bug, and a bug must
not cost anyone a training run: :class:`StepGuard` logs it with its
traceback, skips that step for a capped, growing while (so a bug that
repeats does not flood the log or burn a core), and runs it again later.
The state the step would have changed stays as it was: the last good one.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from allocator.util.retry_timer import RetryTimer

__all__ = ["StepGuard"]

#: Longest wait before retrying a step that failed unexpectedly.
RETRY_CAP_SECONDS = 30.0
_RETRY_BASE_SECONDS = 0.2


class StepGuard:
    """Run named steps; a step that raised waits out its backoff before it runs again."""

    def __init__(
        self,
        clock: Callable[[], float],
        log: Callable[[str, dict[str, Any]], None],
        context: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self._clock = clock
        self._log = log
        self._context = context
        self._faults: dict[str, tuple[RetryTimer, float]] = {}

    def run(self, step: str, operation: Callable[[], None]) -> bool:
        """Run ``operation`` unless ``step`` is backing off; return whether it ran and succeeded."""
        fault = self._faults.get(step)
        now = self._clock()
        if fault is not None and now < fault[1]:
            return False
        try:
            operation()
        except Exception as exc:
            timer = (
                fault[0]
                if fault is not None
                else RetryTimer(RETRY_CAP_SECONDS, _RETRY_BASE_SECONDS)
            )
            retry_at = timer.failed(now)
            self._faults[step] = (timer, retry_at)
            self._log(
                "internal-error",
                {
                    "step": step,
                    "error": f"{type(exc).__name__}: {exc}",
                    **self._context(),
                    "retry_in": round(retry_at - now, 2),
                    "traceback": "".join(traceback.format_exception(exc)).strip(),
                },
            )
            return False
        if fault is not None:
            del self._faults[step]
            self._log("recovered", {"step": step, "failures": fault[0].failures})
        return True

    def next_retry(self) -> float | None:
        """When the earliest backing-off step may run again (``None`` if none is)."""
        return min((at for _timer, at in self._faults.values()), default=None)
