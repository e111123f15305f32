"""NVIDIA's GPU health: a pure evaluator over NVML signals, and a reader that feeds it.

The verdicts are :mod:`allocator.gpus.health`'s records; :class:`NvmlHealthMonitor`
is NVIDIA's :class:`~allocator.gpus.health.HealthMonitor`.

Rules (all evaluated by :func:`check_health`, time passed in):

* **XID critical events** make a GPU unhealthy, except the application
  XIDs in ``policy.health.ignored_xids`` (13, 31, 43, 45, 68, 109 by
  default). An XID is a one-shot event: it keeps the GPU unhealthy until
  ``recover_after`` consecutive clean checks *after* the check that saw it.
* **Cumulative error counters** (uncorrected ECC, volatile and lifetime;
  rows remapped and pages retired after uncorrectable errors): a GPU is
  unhealthy on a check where a counter rose above its baseline. The
  baseline is the first value read (or one the caller restores from an
  earlier run of the agent), never 0: an old count says nothing new, and a
  restarted agent must not condemn a GPU for errors it already judged. A
  counter that goes down (driver reload) just becomes the new baseline.
* **Row remapping** failed or pending (a reset is needed): unhealthy for
  as long as NVML says so.
* **A failing device call** (GPU lost, unknown error, reset required) or a
  GPU that NVML stopped reporting: unhealthy while it lasts.

Recovery: an unhealthy GPU whose signals are clean again is re-tested on
each following check and returned to service after ``recover_after``
(default 2) consecutive clean checks; any bad signal restarts the count.

NVML itself failing is no verdict: :class:`NvmlHealthMonitor` keeps its last
state, says why in ``error``, and re-opens NVML with a capped backoff (or
at once, on :meth:`NvmlHealthMonitor.reopen`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from allocator.gpus.health import (
    DEFAULT_IGNORED_XIDS,
    DEFAULT_RECOVER_AFTER,
    Baselines,
    GpuHealth,
    HealthState,
)
from allocator.gpus.vendors.nvidia.nvml import NvmlUnavailable, load_nvml
from allocator.gpus.vendors.nvidia.signals import COUNTERS, GpuSignals, NvmlSignalReader

__all__ = [
    "GpuSignals",
    "NvmlHealthMonitor",
    "check_health",
    "next_baselines",
    "open_signal_reader",
    "signal_problems",
]

#: Re-opening NVML after it failed: first retry after this many seconds, doubling ...
REOPEN_FIRST_SECONDS = 1.0
#: ... up to this.
REOPEN_MAX_SECONDS = 60.0

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


def signal_problems(
    signals: GpuSignals, ignored_xids: frozenset[int], baselines: Mapping[str, int]
) -> list[str]:
    """What is wrong with a GPU according to one read (empty: clean).

    A counter without a baseline (first sight) is never a problem.
    """
    problems: list[str] = []
    if signals.failure is not None:
        problems.append(f"device error: {signals.failure}")
    for xid in signals.xids:
        if xid not in ignored_xids:
            name = _XID_NAMES.get(xid)
            problems.append(f"XID {xid}" + (f" ({name})" if name else ""))
    for counter, count in signals.counters().items():
        before = baselines.get(counter)
        if before is not None and count > before:
            problems.append(f"{COUNTERS[counter]}: {count} (was {before})")
    if signals.remap_failure:
        problems.append("row remapping failed")
    if signals.remap_pending:
        problems.append("row remapping pending (GPU reset required)")
    return problems


def next_baselines(before: Mapping[str, int], signals: GpuSignals) -> Baselines:
    """The baselines after a read: every counter read becomes its own baseline.

    Up (judged already), down (driver reload reset it) or first seen: the
    value just read is what the next read is compared with. A counter the
    read did not report keeps its old baseline.
    """
    merged = {**before, **signals.counters()}
    return tuple(sorted(merged.items()))


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
    old = dict(last.baselines) if last is not None else {}
    problems = signal_problems(signals, ignored_xids, old)
    baselines = next_baselines(old, signals)
    uuid = signals.uuid or (last.uuid if last is not None else None)
    index = signals.index
    if problems:
        since = last.since if last is not None and not last.healthy else now
        return GpuHealth(index, False, "; ".join(problems), since, 0, baselines, uuid)
    if last is None or last.healthy:
        since = last.since if last is not None else now
        return GpuHealth(index, True, None, since, 0, baselines, uuid)
    clean = last.clean_checks + 1
    if clean >= recover_after:
        return GpuHealth(index, True, None, now, 0, baselines, uuid)
    return GpuHealth(index, False, last.reason, last.since, clean, baselines, uuid)


def open_signal_reader(environ: Mapping[str, str] | None = None) -> NvmlSignalReader:
    """Open NVML (or the fake chosen by ``ALLOCATOR_NVML``) for repeated health reads.

    Raises :class:`~allocator.gpus.vendors.nvidia.nvml.NvmlUnavailable` when NVML cannot be used.
    """
    return NvmlSignalReader(load_nvml(os.environ if environ is None else environ))


class NvmlHealthMonitor:
    """Reads signals and evaluates them, keeping the state between checks.

    When NVML cannot be opened, or stops answering, a check returns the last
    state unchanged (empty if there is none) and ``error`` says why; NVML is
    re-opened on a later check (1 s, doubling to 60 s) or by :meth:`reopen`.
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
        self._environ = dict(os.environ if environ is None else environ)
        self._reader: NvmlSignalReader | None = None
        self._failures = 0
        self._reopen_at = 0.0
        self._open(0.0)

    def _open(self, now: float) -> NvmlSignalReader | None:
        try:
            self._reader = open_signal_reader(self._environ)
        except NvmlUnavailable as exc:
            self._failed(str(exc), now)
        return self._reader

    def _failed(self, error: str, now: float) -> None:
        self.error = error
        delay = min(REOPEN_FIRST_SECONDS * 2.0 ** min(self._failures, 16), REOPEN_MAX_SECONDS)
        self._failures += 1
        self._reopen_at = now + delay

    def resume(self, state: HealthState) -> None:
        """Continue from ``state`` (restored from an earlier run): its baselines and verdicts."""
        self.state = state

    def check(self, now: float) -> HealthState:
        """Read the signals now and return the new state (the last one if NVML fails)."""
        reader = self._reader
        if reader is None and now >= self._reopen_at:
            reader = self._open(now)
        if reader is None:
            return self._unchanged(now)
        try:
            signals = reader.read()
        except NvmlUnavailable as exc:
            self._close_reader()
            self._failed(str(exc), now)
            return self._unchanged(now)
        self.error, self._failures = None, 0
        self.state = check_health(
            signals, self.ignored_xids, self.state, now, recover_after=self.recover_after
        )
        return self.state

    def _unchanged(self, now: float) -> HealthState:
        if self.state is None:
            return HealthState(gpus=(), checked_at=now, recover_after=self.recover_after)
        return self.state

    def reopen(self, now: float) -> None:
        """Close NVML and open it again now (SIGHUP: the driver may have been reloaded)."""
        self._close_reader()
        self._failures = 0
        if self._open(now) is not None:
            self.error = None

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        """Release NVML."""
        self._close_reader()

    def __enter__(self) -> NvmlHealthMonitor:
        """Use as a context manager that closes NVML on exit."""
        return self

    def __exit__(self, *exc: Any) -> None:
        """Close on exit."""
        self.close()
