"""The agent's GPU care, as one part of the agent: its GPUs' state, their MPS daemons, the checks.

The loop asks :meth:`GpuCare.due` whether a health check is due and runs
:meth:`GpuCare.check`; what is out of service, the inventory and the jobs
pinned in their fallback are read from here (they live in
:class:`~allocator.agent.gpu_care.state.GpuState`, which saves them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from allocator.agent.gpu_care.mps import MpsDaemons
from allocator.agent.gpu_care.state import GpuState
from allocator.agent.log import DecisionLog
from allocator.agent.planning.types import Pin
from allocator.gpus.health import HealthMonitor
from allocator.gpus.inventory import Inventory
from allocator.policy.model import Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["GpuCare"]

#: Between health checks while no policy says otherwise.
DEFAULT_INTERVAL_SECONDS = 5.0


class GpuCare:
    """Inventory, health verdicts, hold-down pins and MPS daemons of this host's GPUs."""

    def __init__(self, environ: Mapping[str, str], agent_dir: Path, log: DecisionLog, now: float):
        self.state = GpuState(environ, agent_dir / "gpus.json", log, now)
        self.mps = MpsDaemons(agent_dir / "mps", log, environ)
        self.next_check = 0.0  # the first check comes at once
        self._log = log

    @property
    def inventory(self) -> Inventory:
        """The GPUs NVML names (the last good ones while it fails), or the declared count."""
        return self.state.inventory

    @property
    def gpus(self) -> tuple[GpuInfo, ...] | None:
        """The inventory's GPUs, or None when it names none (nothing known)."""
        return self.state.inventory.gpus or None

    @property
    def unhealthy(self) -> dict[int, str]:
        """The GPUs out of service after the last check (index -> reason)."""
        return self.state.unhealthy

    @property
    def pins(self) -> dict[str, Pin]:
        """The jobs the flap limit holds in their fallback."""
        return self.state.pins

    @property
    def health(self) -> HealthMonitor | None:
        """The vendor's health monitor (NVML's signals); ``None`` where it has none."""
        return self.state.monitor

    def use_policy(self, policy: Policy, host: str, now: float) -> None:
        """A new policy: its declared GPU count (while NVML names none), its XIDs, a check now."""
        if self.inventory.source in ("declared", "none"):
            self.read_inventory(policy, host, now)
        if self.health is not None:
            self.health.ignored_xids = policy.health.ignored_xids
        self.next_check = 0.0  # check now, and from now on at the policy's interval

    def read_inventory(self, policy: Policy | None, host: str, now: float) -> Inventory:
        """NVML's GPUs (the last good ones while it fails), else the count the policy declares."""
        declared = policy.hosts.get(host) if policy is not None else None
        vendor = policy.vendor_of(host) if policy is not None else None
        return self.state.reload(declared.gpus if declared else None, now, vendor)

    def due(self, now: float) -> bool:
        """Whether a health check is due."""
        return now >= self.next_check

    def check(
        self,
        now: float,
        policy: Policy | None,
        host: str,
        assignments: Mapping[str, Assignment] | None,
    ) -> None:
        """One health check (see :meth:`GpuState.check`); logs a change of what is out."""
        interval = (
            policy.health.interval_seconds if policy is not None else DEFAULT_INTERVAL_SECONDS
        )
        self.next_check = now + interval
        before = set(self.unhealthy)
        unhealthy = self.state.check(now, policy, host, assignments)
        if set(unhealthy) != before:
            self._log("health", {"unhealthy": {str(k): v for k, v in sorted(unhealthy.items())}})

    def close(self) -> None:
        """Release NVML."""
        self.state.close()
