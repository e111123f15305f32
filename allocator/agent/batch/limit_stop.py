"""A submitted job's time limit: SIGTERM when its ``ends_at`` comes, SIGKILL after its grace.

The runner asks on each tick which signal is due (no store call); the
clocks are passed in, so the decision is tested without waiting. The
signals go to the command's process group; whatever of it left the group
carries the holding's identity, and the agent's enforcer stops it once the
holding is released (:mod:`allocator.agent.processes.holding_ends`).
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from datetime import datetime

from allocator.placement.time_limit import limit_reached

__all__ = ["DEFAULT_GRACE", "LimitStop"]

#: Seconds from SIGTERM to SIGKILL for a submitted job the policy does not declare.
DEFAULT_GRACE = 10.0


@dataclass
class LimitStop:
    """When the command of one submitted job must be signalled for its limit (``""``: none)."""

    ends_at: str
    grace: float = DEFAULT_GRACE
    kill_at: float | None = None  # monotonic; set when the SIGTERM was sent

    @property
    def reached(self) -> bool:
        """Whether the limit came (the SIGTERM was sent): its end is a time limit."""
        return self.kill_at is not None

    def due(self, wall: datetime, monotonic: float) -> signal.Signals | None:
        """The signal to send now: SIGTERM at the limit, SIGKILL once after the grace."""
        if self.kill_at is None:
            if not self.ends_at or not limit_reached(self.ends_at, wall):
                return None
            self.kill_at = monotonic + self.grace
            return signal.SIGTERM
        if monotonic >= self.kill_at and not math.isinf(self.kill_at):
            self.kill_at = math.inf
            return signal.SIGKILL
        return None
