"""The agent's view of its GPUs: inventory, health verdicts, hold-down and flap limit.

Each health check runs one pipeline: the vendor's verdicts (its
:class:`~allocator.gpus.health.HealthMonitor`, NVML's signals on NVIDIA; a fresh
inventory read for a vendor without one), then the recovery probe for
GPUs the vendor calls healthy again (:class:`~allocator.agent.gpu_care.recovery.RecoveryProbes`),
then the hold-down and the per-job flap limit (:mod:`allocator.agent.gpu_care.hold_down`).
The result is the set of GPUs out of service, and the jobs held in their fallback.

What an agent restart must not forget is saved in the state directory
(``gpus.json``) and used again on the same boot (``/proc/sys/kernel/random/boot_id``;
after a reboot the GPUs were reset anyway): the last inventory NVML gave, each
GPU's health verdict and counter baselines, its hold-down, and each job's flap
count. Per-GPU entries are matched on the GPU's UUID, so a GPU that moved to
another index, or was swapped, starts afresh. Times are the agent's monotonic
clock, which is system-wide on Linux and so comparable across restarts of one boot.

NVML failing is logged once per distinct error and retried; it never swaps the
inventory for the declared count once NVML has answered (see
:func:`~allocator.gpus.inventory.keep_last_good`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from allocator.agent.gpu_care.hold_down import Damping, Event, FlapLimit, GpuHoldDown, JobGpus
from allocator.agent.gpu_care.recovery import RecoveryProbes
from allocator.agent.kernel.procs import clean_base_env
from allocator.agent.planning.types import Pin
from allocator.gpus.health import GpuHealth, HealthMonitor, HealthState
from allocator.gpus.inventory import Inventory, from_nvml, keep_addresses, keep_last_good
from allocator.gpus.vendors.registry import VENDORS, read_host_inventory, vendor_named
from allocator.policy.model import HealthSettings, Policy
from allocator.records.types import Assignment

__all__ = ["GpuState", "current_boot_id", "flap_candidates"]

Logger = Callable[[str, dict[str, object]], None]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: Retrying a failed inventory read: after 5 s, doubling to 5 minutes.
_RETRY_FIRST_SECONDS = 5.0
_RETRY_MAX_SECONDS = 300.0


def current_boot_id() -> str:
    """This boot's id (empty where the kernel does not say)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def flap_candidates(
    policy: Policy, host: str, assignments: Mapping[str, Assignment]
) -> dict[str, JobGpus]:
    """Jobs on ``host`` that GPU health moves: on GPUs, with a cpu or wait fallback rule."""
    found: dict[str, JobGpus] = {}
    for name, assignment in sorted(assignments.items()):
        rule = policy.fallback_for(name)
        if assignment.host != host or assignment.mode != "gpu" or rule is None:
            continue
        if rule.action in ("cpu", "wait") and assignment.gpus:
            found[name] = JobGpus(assignment.gpus, "cpu" if rule.action == "cpu" else "wait")
    return found


class GpuState:
    """Inventory, health, hold-down and flap pins of one host; saved to ``path``."""

    def __init__(
        self,
        environ: Mapping[str, str],
        path: Path,
        log: Logger,
        now: float,
        *,
        boot_id: str | None = None,
        recovery: RecoveryProbes | None = None,
    ) -> None:
        """Read the inventory, open its vendor's health monitor, and resume what the last
        run on this boot saved.

        The monitor is the vendor's whose library answered now: NVIDIA's while none
        did (detection off, no driver yet), which re-opens NVML until it answers.
        """
        self._environ = dict(environ)
        self._path = path
        self._log = log
        self._boot = current_boot_id() if boot_id is None else boot_id
        saved = _load(path, self._boot)
        self._last_good = _saved_inventory(saved)
        self._inventory_error: str | None = None
        self._health_error: str | None = None
        self._retry_at: float | None = None
        self._retries = 0
        self._written = b""
        self.inventory = self._read(None, now, None)
        same = _same_gpus(saved, self.inventory)
        self.monitor = vendor_named(self.inventory.vendor).health_monitor(self._environ)
        health = _saved_health(saved, same)
        if health is not None and self.monitor is not None:
            self.monitor.resume(health)
        self.hold_down = GpuHoldDown(_only(saved.get("hold_down", {}), same))
        self.flaps = FlapLimit(saved.get("flaps"))
        self.pins: dict[str, Pin] = _saved_pins(saved)
        self._probe_out: dict[int, str] = self.hold_down.unhealthy_now()
        self.recovery = recovery or RecoveryProbes(clean_base_env(self._environ), log)
        self.unhealthy: dict[int, str] = self.hold_down.out()
        if self.unhealthy or self.pins:
            out = {str(index): reason for index, reason in self.unhealthy.items()}
            self._log("gpu-state-resumed", {"out": out, "pinned": sorted(self.pins)})
        self._save()

    # --- inventory --------------------------------------------------------------

    def read_inventory(
        self, declared_gpus: int | None, now: float, vendor: str | None = None
    ) -> Inventory:
        """Read NVML now; on failure keep the last good inventory and schedule a retry.

        ``vendor`` is the policy's for this host (whose GPUs it declares).
        """
        self.inventory = self._read(declared_gpus, now, vendor)
        self._save()
        return self.inventory

    def _read(self, declared_gpus: int | None, now: float, vendor: str | None) -> Inventory:
        fresh = read_host_inventory(declared_gpus, environ=self._environ, vendor=vendor)
        # NVML keeps its indices when a GPU fails; sysfs and amdsmi renumber.
        devices = VENDORS.get(fresh.vendor)
        keep = keep_last_good if devices is not None and devices.keeps_indices else keep_addresses
        chosen = keep(self._last_good, fresh)
        if from_nvml(fresh):
            self._last_good, self._retry_at, self._retries = chosen, None, 0
            if self._inventory_error is not None:
                self._log("nvml-inventory-recovered", {"gpus": len(chosen.gpus)})
            self._inventory_error = None
        else:
            delay = min(_RETRY_FIRST_SECONDS * 2.0 ** min(self._retries, 16), _RETRY_MAX_SECONDS)
            self._retry_at, self._retries = now + delay, self._retries + 1
            if fresh.error != self._inventory_error:
                self._inventory_error = fresh.error
                kept = self._last_good is not None
                self._log(
                    "nvml-inventory-failed",
                    {"error": fresh.error, "kept_last_good": kept, "retry_in": delay},
                )
        return chosen

    def reload(self, declared_gpus: int | None, now: float, vendor: str | None = None) -> Inventory:
        """SIGHUP: re-read the inventory and re-open the health monitor's library."""
        if self.monitor is not None:
            self.monitor.reopen(now)
        return self.read_inventory(declared_gpus, now, vendor)

    # --- health ------------------------------------------------------------------

    def check(
        self,
        now: float,
        policy: Policy | None,
        host: str,
        assignments: Mapping[str, Assignment] | None,
    ) -> dict[int, str]:
        """One health check: the GPUs out of service now (index -> reason).

        ``assignments`` is ``None`` until the agent has read them; the flap
        limit then keeps its last pins rather than forgetting every job.
        """
        settings = policy.health if policy is not None else HealthSettings()
        damping = Damping.from_policy(settings)
        devices = VENDORS.get(self.inventory.vendor)
        monitor = self.monitor
        if monitor is None or devices is None or devices.health_source != "signals":
            verdicts = self._vendor_verdicts(_declared(policy, host), now, _vendor(policy, host))
        else:
            if self._retry_at is not None and now >= self._retry_at:
                self.read_inventory(_declared(policy, host), now, _vendor(policy, host))
            state = monitor.check(now)
            self._note_health_error(monitor)
            verdicts = {g.index: g.reason or "unhealthy" for g in state.gpus if not g.healthy}
        self._probe_out = self.recovery.out_of_service(
            verdicts,
            self._probe_out,
            settings.recovery_probe,
            settings.recovery_probe_timeout_seconds,
            self.inventory.gpus or None,
            now,
            retry_after=30 * settings.interval_seconds,
            vendor=self.inventory.vendor,
        )
        out, events = self.hold_down.update(self._probe_out, damping, now)
        if assignments is not None and policy is not None:
            jobs = flap_candidates(policy, host, assignments)
            self.pins, more = self.flaps.update(jobs, out, self.hold_down, damping, now)
            events += more
        self._emit(events)
        self.unhealthy = out
        self._save()
        return out

    def _vendor_verdicts(
        self, declared_gpus: int | None, now: float, vendor: str | None
    ) -> dict[int, str]:
        """Another vendor's health: its library read afresh, each GPU it could not read
        (or that reports uncorrectable errors) out of service. NVML's signals (XIDs,
        counters rising) are NVIDIA's; a failed read keeps the last verdicts' GPUs."""
        inventory = self.read_inventory(declared_gpus, now, vendor)
        return {gpu.index: gpu.error for gpu in inventory.gpus if gpu.error}

    def _note_health_error(self, monitor: HealthMonitor) -> None:
        error = monitor.error
        if error == self._health_error:
            return
        if error is None:
            self._log("nvml-health-recovered", {})
        else:
            self._log("nvml-health-failed", {"error": error, "keeping_last_verdicts": True})
        self._health_error = error

    def _emit(self, events: list[Event]) -> None:
        for name, fields in events:
            self._log(name, fields)

    def close(self) -> None:
        """Release the health monitor's library."""
        if self.monitor is not None:
            self.monitor.close()

    # --- the state file --------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        health = self.monitor.state if self.monitor is not None else None
        return {
            "boot_id": self._boot,
            "inventory": self._last_good.to_dict() if self._last_good is not None else None,
            "uuids": {str(g.index): g.uuid for g in self.inventory.gpus},
            "health": [_health_to_dict(g) for g in health.gpus] if health is not None else [],
            "hold_down": self.hold_down.to_dict(),
            "flaps": self.flaps.to_dict(),
            "pins": {
                job: {"unhealthy": {str(k): v for k, v in pin.unhealthy.items()}, "note": pin.note}
                for job, pin in sorted(self.pins.items())
            },
        }

    def _save(self) -> None:
        data = json.dumps(self._snapshot(), sort_keys=True).encode()
        if data == self._written:
            return
        tmp = self._path.with_name(self._path.name + ".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self._path)
            self._written = data
        except OSError as exc:
            self._log("state-write-failed", {"path": str(self._path), "error": str(exc)})


def _declared(policy: Policy | None, host: str) -> int | None:
    declared = policy.hosts.get(host) if policy is not None else None
    return declared.gpus if declared is not None else None


def _vendor(policy: Policy | None, host: str) -> str | None:
    return policy.vendor_of(host) if policy is not None else None


def _load(path: Path, boot: str) -> dict[str, Any]:
    """The saved state of this boot; ``{}`` when absent, unreadable, or from another boot."""
    with suppress(OSError, ValueError):
        data = json.loads(path.read_bytes())
        if isinstance(data, dict) and data.get("boot_id") == boot:
            return data
    return {}


def _saved_inventory(saved: Mapping[str, Any]) -> Inventory | None:
    raw = saved.get("inventory")
    if not isinstance(raw, dict):
        return None
    try:
        return Inventory.from_dict(raw)
    except (ValueError, TypeError):
        return None


def _same_gpus(saved: Mapping[str, Any], inventory: Inventory) -> set[int]:
    """Indices whose GPU is the one the saved state describes (same UUID, or neither known)."""
    uuids = saved.get("uuids")
    if not isinstance(uuids, dict):
        return set()
    current = {str(gpu.index): gpu.uuid for gpu in inventory.gpus}
    return {int(k) for k, uuid in uuids.items() if k in current and current[k] == uuid}


def _only(entries: Mapping[str, Any], same: set[int]) -> dict[str, Any]:
    return {k: v for k, v in entries.items() if k.isdigit() and int(k) in same}


def _health_to_dict(gpu: GpuHealth) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "healthy": gpu.healthy,
        "reason": gpu.reason,
        "since": gpu.since,
        "clean_checks": gpu.clean_checks,
        "baselines": dict(gpu.baselines),
        "uuid": gpu.uuid,
    }


def _saved_health(saved: Mapping[str, Any], same: set[int]) -> HealthState | None:
    gpus: list[GpuHealth] = []
    for raw in saved.get("health", ()):
        with suppress(KeyError, TypeError, ValueError, AttributeError):
            if int(raw["index"]) in same:
                gpus.append(
                    GpuHealth(
                        index=int(raw["index"]),
                        healthy=bool(raw["healthy"]),
                        reason=raw.get("reason"),
                        since=float(raw["since"]),
                        clean_checks=int(raw["clean_checks"]),
                        baselines=tuple(
                            sorted((str(k), int(v)) for k, v in raw["baselines"].items())
                        ),
                        uuid=raw.get("uuid"),
                    )
                )
    return HealthState(tuple(gpus), checked_at=0.0) if gpus else None


def _saved_pins(saved: Mapping[str, Any]) -> dict[str, Pin]:
    pins: dict[str, Pin] = {}
    for job, raw in (saved.get("pins") or {}).items():
        with suppress(KeyError, TypeError, ValueError, AttributeError):
            unhealthy = {int(k): str(v) for k, v in raw["unhealthy"].items()}
            pins[str(job)] = Pin(unhealthy, str(raw["note"]))
    return pins
