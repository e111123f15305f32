"""Damping a flapping GPU: a hold-down before it returns, and a flap limit per job.

A GPU that turns unhealthy and healthy every few seconds would otherwise
move its jobs between GPU and CPU (or stop and start them) without end,
since a restart caused by a change is never backed off. Two rules, both
pure and clock-injected (every method takes ``now``):

* **Hold-down** (:class:`GpuHoldDown`), like the kubelet's restart backoff:
  a GPU that was out of service must stay healthy for ``hold_down_seconds``
  before jobs return to it; each further failure doubles that, up to
  ``hold_down_max_seconds``. A GPU that fails again while held down starts
  over with the longer hold. A GPU that stays in service for
  ``hold_down_max_seconds`` is *stable*: its failures are forgotten.
* **Flap limit** (:class:`FlapLimit`): every move of a job caused by GPU
  health (off its GPU, and back) counts as a restart. Once a job has had
  ``flap_restart_limit`` of them, it stays where it is safest (on CPU for a
  ``cpu`` fallback rule, stopped for ``wait``) until all its GPUs are stable,
  then returns and its count starts again. Moving off a bad GPU is never
  refused; returning to it is what the limit holds back.

A GPU keeps the reason it went out with while it stays out: the reason is a
worker's ``ALLOCATOR_FALLBACK_REASON``, and a changing one would restart it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from allocator.agent.planning.types import Pin
from allocator.policy.model import HealthSettings

__all__ = ["Damping", "Event", "FlapLimit", "GpuHoldDown", "JobGpus", "hold_down_for"]

#: A log line the caller writes: event name and fields.
Event = tuple[str, dict[str, object]]
SafeAction = Literal["cpu", "wait"]


@dataclass(frozen=True, slots=True)
class Damping:
    """The policy's damping settings (``health:`` section)."""

    hold_down_seconds: float = 10.0
    hold_down_max_seconds: float = 300.0
    flap_restart_limit: int = 4

    @classmethod
    def from_policy(cls, health: HealthSettings) -> Damping:
        """The settings of a policy's ``health`` section."""
        return cls(
            health.hold_down_seconds, health.hold_down_max_seconds, health.flap_restart_limit
        )


def hold_down_for(failures: int, base: float, cap: float) -> float:
    """Seconds a GPU is held out after its ``failures``-th failure: base * 2**(n-1), capped."""
    if base <= 0 or failures <= 0:
        return 0.0
    doublings = failures - 1
    if doublings >= 64 or base * 2.0**doublings >= cap:  # no float overflow on long flapping
        return max(cap, 0.0)
    return base * 2.0**doublings


@dataclass(slots=True)
class _Gpu:
    """One GPU's damping state; ``out_reason`` is set while it is out of service."""

    failures: int = 0
    out_reason: str | None = None
    held_until: float | None = None
    in_service_since: float | None = None


class GpuHoldDown:
    """Which GPUs are out of service, given which are unhealthy now (see the module doc)."""

    def __init__(self, saved: Mapping[str, Any] | None = None) -> None:
        """Start empty, or from :meth:`to_dict` output of an earlier run (same boot)."""
        self._gpus: dict[int, _Gpu] = {}
        for key, raw in (saved or {}).items():
            self._gpus[int(key)] = _Gpu(
                failures=int(raw["failures"]),
                out_reason=_optional_str(raw.get("out_reason")),
                held_until=_optional_float(raw.get("held_until")),
                in_service_since=_optional_float(raw.get("in_service_since")),
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state, for the agent's state directory."""
        return {
            str(index): {
                "failures": gpu.failures,
                "out_reason": gpu.out_reason,
                "held_until": gpu.held_until,
                "in_service_since": gpu.in_service_since,
            }
            for index, gpu in sorted(self._gpus.items())
        }

    def out(self) -> dict[int, str]:
        """GPUs out of service (unhealthy or held down) and the reason each went out with."""
        return {i: g.out_reason for i, g in sorted(self._gpus.items()) if g.out_reason is not None}

    def unhealthy_now(self) -> dict[int, str]:
        """GPUs out of service that are not (yet) held down: the health checks still fail."""
        return {
            index: gpu.out_reason
            for index, gpu in sorted(self._gpus.items())
            if gpu.out_reason is not None and gpu.held_until is None
        }

    def stable(self, index: int, settings: Damping, now: float) -> bool:
        """In service for at least ``hold_down_max_seconds`` (or never seen failing)."""
        gpu = self._gpus.get(index)
        if gpu is None:
            return True
        if gpu.out_reason is not None or gpu.in_service_since is None:
            return False
        return now - gpu.in_service_since >= settings.hold_down_max_seconds

    def update(
        self, unhealthy: Mapping[int, str], settings: Damping, now: float
    ) -> tuple[dict[int, str], list[Event]]:
        """Apply one health verdict; return the GPUs out of service and what changed."""
        events: list[Event] = []
        for index in sorted(set(self._gpus) | set(unhealthy)):
            gpu = self._gpus.setdefault(index, _Gpu())
            if index in unhealthy:
                self._failing(index, gpu, unhealthy[index], settings, now, events)
            else:
                self._healthy(index, gpu, settings, now, events)
            if gpu.out_reason is None and gpu.failures == 0:
                del self._gpus[index]  # stable again: nothing to remember
        return self.out(), events

    def _failing(
        self, index: int, gpu: _Gpu, reason: str, settings: Damping, now: float, out: list[Event]
    ) -> None:
        if gpu.out_reason is not None and gpu.held_until is None:
            return  # still unhealthy: nothing new
        if gpu.out_reason is None and self.stable(index, settings, now):
            gpu.failures = 0  # a long healthy period: this failure starts afresh
        gpu.failures += 1
        held = gpu.held_until is not None
        gpu.out_reason = gpu.out_reason or reason
        gpu.held_until, gpu.in_service_since = None, None
        event = "gpu-failed-in-hold-down" if held else "gpu-out"
        out.append((event, {"gpu": index, "reason": reason, "failures": gpu.failures}))

    def _healthy(
        self, index: int, gpu: _Gpu, settings: Damping, now: float, out: list[Event]
    ) -> None:
        if gpu.out_reason is None:
            if gpu.failures and self.stable(index, settings, now):
                gpu.failures = 0
            return
        if gpu.held_until is None:
            hold = hold_down_for(
                gpu.failures, settings.hold_down_seconds, settings.hold_down_max_seconds
            )
            gpu.held_until = now + hold
            fields: dict[str, object] = {"gpu": index, "seconds": hold, "failures": gpu.failures}
            out.append(("gpu-hold-down", fields))
        if now >= gpu.held_until:
            gpu.out_reason, gpu.held_until, gpu.in_service_since = None, None, now
            out.append(("gpu-returned", {"gpu": index, "failures": gpu.failures}))


@dataclass(frozen=True, slots=True)
class JobGpus:
    """A job whose GPUs' health can move it: its GPUs and its fallback action."""

    gpus: tuple[int, ...]
    action: SafeAction


@dataclass(slots=True)
class _Job:
    gpus: tuple[int, ...]
    restarts: int = 0
    off: dict[int, str] | None = None  # while moved off: the GPUs (and reasons) that did it
    pinned: bool = False


class FlapLimit:
    """Counts each job's health-driven restarts and holds it in its fallback past the limit."""

    def __init__(self, saved: Mapping[str, Any] | None = None) -> None:
        """Start empty, or from :meth:`to_dict` output of an earlier run (same boot)."""
        self._jobs: dict[str, _Job] = {}
        for name, raw in (saved or {}).items():
            off = raw.get("off")
            self._jobs[name] = _Job(
                gpus=tuple(int(g) for g in raw["gpus"]),
                restarts=int(raw["restarts"]),
                off={int(k): str(v) for k, v in off.items()} if off is not None else None,
                pinned=bool(raw.get("pinned", False)),
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready state, for the agent's state directory."""
        return {
            name: {
                "gpus": list(job.gpus),
                "restarts": job.restarts,
                "off": {str(k): v for k, v in job.off.items()} if job.off is not None else None,
                "pinned": job.pinned,
            }
            for name, job in sorted(self._jobs.items())
            if job.restarts or job.off is not None
        }

    def restarts(self, job: str) -> int:
        """Health-driven restarts of ``job`` counted in its current episode."""
        known = self._jobs.get(job)
        return known.restarts if known is not None else 0

    def update(
        self,
        jobs: Mapping[str, JobGpus],
        out: Mapping[int, str],
        gpus: GpuHoldDown,
        settings: Damping,
        now: float,
    ) -> tuple[dict[str, Pin], list[Event]]:
        """Follow each job's GPUs; return the jobs held in their fallback, and what changed."""
        events: list[Event] = []
        pins: dict[str, Pin] = {}
        self._jobs = {n: j for n, j in self._jobs.items() if n in jobs and j.gpus == jobs[n].gpus}
        for name, spec in sorted(jobs.items()):
            job = self._jobs.setdefault(name, _Job(spec.gpus))
            bad = {gpu: out[gpu] for gpu in spec.gpus if gpu in out}
            stable = all(gpus.stable(gpu, settings, now) for gpu in spec.gpus)
            if bad:
                if job.off is None:
                    job.restarts += 1  # moved off its GPU
                job.off = bad
            elif job.off is not None:
                pin = self._returning(name, job, spec, stable, settings, events)
                if pin is not None:
                    pins[name] = pin
            elif stable:
                job.restarts = 0
        return pins, events

    def _returning(
        self,
        name: str,
        job: _Job,
        spec: JobGpus,
        stable: bool,
        settings: Damping,
        events: list[Event],
    ) -> Pin | None:
        """The job's GPUs are back in service: return it, or hold it past the limit."""
        assert job.off is not None
        if job.restarts < settings.flap_restart_limit and not job.pinned:
            job.off, job.restarts = None, job.restarts + 1
            return None
        if stable:
            job.off, job.pinned, job.restarts = None, False, 0
            events.append(("job-flap-released", {"job": name, "gpus": list(spec.gpus)}))
            return None
        note = _pin_note(job, spec, settings)
        if not job.pinned:
            job.pinned = True
            events.append(("job-flap-limit", {"job": name, "restarts": job.restarts, "why": note}))
        return Pin(dict(job.off), note)


def _pin_note(job: _Job, spec: JobGpus, settings: Damping) -> str:
    gpus = ",".join(str(gpu) for gpu in spec.gpus)
    where = "on CPU" if spec.action == "cpu" else "stopped"
    return (
        f"GPU {gpus} flapped: {job.restarts} health-driven restarts "
        f"(flap_restart_limit {settings.flap_restart_limit}); the job stays {where} until "
        f"GPU {gpus} has been in service for {settings.hold_down_max_seconds:g}s"
    )


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _optional_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
