"""GPU health: a pure evaluator over NVML signals, and a reader that feeds it.

Rules (all evaluated by :func:`check_health`, time passed in):

* **XID critical events** make a GPU unhealthy, except the application
  XIDs in ``policy.health.ignored_xids`` (13, 31, 43, 45, 68, 109 by
  default). An XID is a one-shot event: it keeps the GPU unhealthy until
  ``recover_after`` consecutive clean checks *after* the check that saw it.
* **Uncorrected ECC errors** use NVML's volatile counter (errors since the
  driver loaded). A GPU is unhealthy on a check where the count rose above
  the previous check's; when a GPU is first seen the baseline is 0, so any
  uncorrected error since the driver loaded counts once. A counter that
  goes down (driver reload) just becomes the new baseline.
* **Row remapping** failed or pending (a reset is needed): unhealthy for
  as long as NVML says so.
* **A failing device call** (GPU lost, unknown error, reset required) or a
  GPU that NVML stopped reporting: unhealthy while it lasts.

Recovery: an unhealthy GPU whose signals are clean again is re-tested on
each following check and returned to service after ``recover_after``
(default 2) consecutive clean checks; any bad signal restarts the count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.gpus.nvml import GpuSignals, NvmlSignalReader, NvmlUnavailable, load_nvml
from allocator.policy.model import DEFAULT_IGNORED_XIDS

__all__ = [
    "DEFAULT_RECOVER_AFTER",
    "GpuHealth",
    "GpuSignals",
    "HealthMonitor",
    "HealthState",
    "check_health",
    "open_signal_reader",
    "signal_problems",
]

DEFAULT_RECOVER_AFTER = 2

# A few XIDs worth naming in a reason (NVIDIA's XID catalogue).
_XID_NAMES = {
    48: "double-bit ECC error",
    63: "row remapping event",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health after a check.

    ``reason`` is the latest bad signal while unhealthy; ``since`` is when
    the GPU entered its current state; ``clean_checks`` counts consecutive
    clean checks while unhealthy; ``ecc_uncorrected`` is the ECC baseline
    for the next check.
    """

    index: int
    healthy: bool
    reason: str | None = None
    since: float = 0.0
    clean_checks: int = 0
    ecc_uncorrected: int | None = None

    @property
    def recovering(self) -> bool:
        """Unhealthy, but its signals have been clean for at least one check."""
        return not self.healthy and self.clean_checks > 0


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


def signal_problems(
    signals: GpuSignals, ignored_xids: frozenset[int], ecc_baseline: int | None
) -> list[str]:
    """What is wrong with a GPU according to one read (empty: clean)."""
    problems: list[str] = []
    if signals.failure is not None:
        problems.append(f"device error: {signals.failure}")
    for xid in signals.xids:
        if xid not in ignored_xids:
            name = _XID_NAMES.get(xid)
            problems.append(f"XID {xid}" + (f" ({name})" if name else ""))
    count = signals.ecc_uncorrected
    before = ecc_baseline or 0
    if count is not None and count > before:
        problems.append(f"uncorrected ECC errors: {count} (was {before})")
    if signals.remap_failure:
        problems.append("row remapping failed")
    if signals.remap_pending:
        problems.append("row remapping pending (GPU reset required)")
    return problems


def check_health(
    source: Sequence[GpuSignals],
    ignored_xids: frozenset[int],
    previous: HealthState | None,
    now: float,
    *,
    recover_after: int = DEFAULT_RECOVER_AFTER,
) -> HealthState:
    """Evaluate one read of signals against the previous state (pure)."""
    if recover_after < 1:
        raise ValueError("recover_after must be at least 1")
    before = {gpu.index: gpu for gpu in previous.gpus} if previous is not None else {}
    reported = {signals.index: signals for signals in source}
    for index in before.keys() - reported.keys():
        reported[index] = GpuSignals(index=index, failure="no longer reported by NVML")
    gpus = tuple(
        _next_health(reported[index], before.get(index), ignored_xids, now, recover_after)
        for index in sorted(reported)
    )
    return HealthState(gpus=gpus, checked_at=now, recover_after=recover_after)


def _next_health(
    signals: GpuSignals,
    last: GpuHealth | None,
    ignored_xids: frozenset[int],
    now: float,
    recover_after: int,
) -> GpuHealth:
    baseline = last.ecc_uncorrected if last is not None else None
    problems = signal_problems(signals, ignored_xids, baseline)
    ecc = signals.ecc_uncorrected if signals.ecc_uncorrected is not None else baseline
    if problems:
        since = last.since if last is not None and not last.healthy else now
        return GpuHealth(signals.index, False, "; ".join(problems), since, 0, ecc)
    if last is None or last.healthy:
        since = last.since if last is not None else now
        return GpuHealth(signals.index, True, None, since, 0, ecc)
    clean = last.clean_checks + 1
    if clean >= recover_after:
        return GpuHealth(signals.index, True, None, now, 0, ecc)
    return GpuHealth(signals.index, False, last.reason, last.since, clean, ecc)


def open_signal_reader(environ: Mapping[str, str] | None = None) -> NvmlSignalReader:
    """Open NVML (or the fake chosen by ``ALLOCATOR_NVML``) for repeated health reads.

    Raises :class:`~allocator.gpus.nvml.NvmlUnavailable` when NVML cannot be used.
    """
    return NvmlSignalReader(load_nvml(os.environ if environ is None else environ))


class HealthMonitor:
    """Reads signals and evaluates them, keeping the state between checks.

    Without NVML, every check returns an empty state and ``error`` says why.
    """

    def __init__(
        self,
        ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS,
        *,
        recover_after: int = DEFAULT_RECOVER_AFTER,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """Open the signal reader; NVML being unusable is recorded, not raised."""
        self.ignored_xids = ignored_xids
        self.recover_after = recover_after
        self.error: str | None = None
        self.state: HealthState | None = None
        self._reader: NvmlSignalReader | None = None
        try:
            self._reader = open_signal_reader(environ)
        except NvmlUnavailable as exc:
            self.error = str(exc)

    def check(self, now: float) -> HealthState:
        """Read the signals now and return the new state."""
        signals = self._reader.read() if self._reader is not None else []
        self.state = check_health(
            signals, self.ignored_xids, self.state, now, recover_after=self.recover_after
        )
        return self.state

    def close(self) -> None:
        """Release NVML."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> HealthMonitor:
        """Use as a context manager that closes NVML on exit."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close on exit."""
        self.close()
