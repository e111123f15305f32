"""GPU health as every vendor reports it: the verdicts, and the monitor that keeps them (pure).

A vendor whose library reports health signals between reads (NVIDIA: XIDs and
error counters) gives the agent a :class:`HealthMonitor` through
:meth:`~allocator.gpus.vendors.base.DeviceVendor.health_monitor`; the agent keeps
one, checks it at the policy's interval, saves its :class:`HealthState` and
resumes from it after a restart. A vendor without such signals gives none, and
its GPUs' health is what a fresh inventory read says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "DEFAULT_RECOVER_AFTER",
    "Baselines",
    "GpuHealth",
    "HealthMonitor",
    "HealthState",
]

#: Consecutive clean checks that return an unhealthy GPU to service.
DEFAULT_RECOVER_AFTER = 2

#: The policy's default ``health.ignored_xids``: application-caused XIDs that say
#: nothing about the GPU's health (NVIDIA's XID catalogue: 13 graphics engine
#: exception, 31 MMU fault, 43 reset channel, 45 preemptive cleanup, 68 video
#: processor exception, 109 context switch timeout). The codes are NVIDIA's, but the
#: set is a policy default that the policy model and every monitor start from, so it
#: lives here, where the policy reaches it without loading a vendor's folder.
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

#: Cumulative error counters (name, value) a check compares the next read against.
Baselines = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health after a check.

    ``reason`` is the latest bad signal while unhealthy; ``since`` is when
    the GPU entered its current state; ``clean_checks`` counts consecutive
    clean checks while unhealthy; ``baselines`` are the cumulative counters
    (name, value) the next check compares against; ``uuid`` is the GPU's,
    when the vendor's library gave it (a state restored from disk is matched on it).
    """

    index: int
    healthy: bool
    reason: str | None = None
    since: float = 0.0
    clean_checks: int = 0
    baselines: Baselines = ()
    uuid: str | None = None

    @property
    def recovering(self) -> bool:
        """Unhealthy, but its signals have been clean for at least one check."""
        return not self.healthy and self.clean_checks > 0

    def baseline(self, counter: str) -> int | None:
        """The baseline of one counter."""
        return dict(self.baselines).get(counter)


@dataclass(frozen=True, slots=True)
class HealthState:
    """Every known GPU's health at ``checked_at``."""

    gpus: tuple[GpuHealth, ...]
    checked_at: float
    recover_after: int = DEFAULT_RECOVER_AFTER

    def get(self, index: int) -> GpuHealth | None:
        """The health of GPU ``index``, if known."""
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def healthy_indices(self) -> tuple[int, ...]:
        """Indices of the GPUs in service."""
        return tuple(gpu.index for gpu in self.gpus if gpu.healthy)

    def unhealthy(self) -> dict[int, str]:
        """Index -> reason for every GPU out of service (for the agent record)."""
        out: dict[int, str] = {}
        for gpu in self.gpus:
            if gpu.healthy:
                continue
            reason = gpu.reason or "unhealthy"
            if gpu.recovering:
                reason += f" (recovering: {gpu.clean_checks}/{self.recover_after} clean checks)"
            out[gpu.index] = reason
        return out


class HealthMonitor(Protocol):
    """A vendor's health signals, read and judged between checks, with the state kept.

    Its library failing is no verdict: a check then returns the last state
    unchanged and ``error`` says why, until the library answers again.
    """

    #: The event codes the policy says say nothing about a GPU (``health.ignored_xids``).
    ignored_xids: frozenset[int]
    #: Why the last check could not read the signals (``None``: it could).
    error: str | None
    #: The verdicts of the last check (``None`` before the first).
    state: HealthState | None

    def resume(self, state: HealthState) -> None:
        """Continue from ``state`` (restored from an earlier run): its baselines and verdicts."""
        ...

    def check(self, now: float) -> HealthState:
        """Read the signals now and return the new state (the last one if the library fails)."""
        ...

    def reopen(self, now: float) -> None:
        """Close the library and open it again now (the driver may have been reloaded)."""
        ...

    def close(self) -> None:
        """Release the library."""
        ...
