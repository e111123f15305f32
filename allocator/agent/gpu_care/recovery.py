"""Re-test a GPU that NVML says has recovered before giving it back to jobs.

NVML's signals going quiet after an XID or a lost GPU does not prove the GPU
can hold a CUDA context again. When the policy names a ``recovery_probe``
command, the agent runs it with only that GPU visible (through the host
vendor's own visibility variables, from the device layer: a CUDA variable
hides nothing from ROCm's or Level Zero's runtime), in a spawned process
with a hard timeout (never in the agent, which must not touch CUDA), and keeps
the GPU out of service until the probe passes. A failed probe is tried again
``retry_after`` seconds later (the agent uses 30 health-check intervals); a GPU
that turns bad again drops its probe state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from allocator.agent.kernel.procs import reap_group
from allocator.gpus.probe import ProbeResult, run_deep_probe
from allocator.gpus.vendors.registry import vendor_named
from allocator.records.gpu_info import GpuInfo

__all__ = ["RecoveryProbes", "probe_environment"]

ProbeRunner = Callable[[Mapping[str, str], float, Sequence[str]], ProbeResult]
# The host's inventory and its vendor's name, as the health check has them.
_Gpus = tuple[Sequence[GpuInfo] | None, str | None]


def probe_environment(
    base: Mapping[str, str],
    index: int,
    inventory: Sequence[GpuInfo] | None,
    vendor: str | None = None,
) -> dict[str, str]:
    """``base`` with exactly GPU ``index`` visible, the way ``vendor``'s runtime reads it.

    The variables are the ones a worker given that one GPU gets (by UUID where
    the vendor uses one), plus ``ALLOCATOR_VENDOR``/``ALLOCATOR_DEVICE``/
    ``ALLOCATOR_GPUS`` so a probe written with :mod:`allocator.torch` opens
    the right device type. ``vendor`` ``None`` is NVIDIA.
    """
    devices = vendor_named(vendor)
    known = {gpu.index: gpu for gpu in inventory or () if gpu.index == index}
    ids = devices.device_ids((index,), known, True)
    return {
        **base,
        **devices.visible_env(ids),
        **devices.order_env(),
        "ALLOCATOR_VENDOR": devices.name,
        "ALLOCATOR_DEVICE": devices.torch_device_type,
        "ALLOCATOR_GPUS": str(index),
        "ALLOCATOR_GPU_COUNT": "1",
    }


@dataclass
class _Probe:
    """One GPU's re-test: running, or finished with a result (and when to retry)."""

    thread: threading.Thread | None = None
    result: ProbeResult | None = None
    retry_at: float = 0.0


class RecoveryProbes:
    """Tracks re-tests of recovering GPUs; the loop asks it which GPUs stay out."""

    def __init__(
        self,
        base_env: Mapping[str, str],
        log: Callable[[str, dict[str, object]], None],
        *,
        run_probe: ProbeRunner = run_deep_probe,
    ) -> None:
        self._base_env = dict(base_env)
        self._log = log
        self._run_probe = run_probe
        self._probes: dict[int, _Probe] = {}
        self._lock = threading.Lock()

    def out_of_service(
        self,
        nvml_unhealthy: Mapping[int, str],
        previously_out: Mapping[int, str],
        command: Sequence[str] | None,
        timeout: float,
        inventory: Sequence[GpuInfo] | None,
        now: float,
        retry_after: float = 60.0,
        vendor: str | None = None,
    ) -> dict[int, str]:
        """GPUs to keep out of service: NVML's unhealthy ones, plus recovering GPUs
        whose probe has not passed yet (index -> reason). ``vendor``: whose GPUs
        (``None``: NVIDIA)."""
        out = dict(nvml_unhealthy)
        with self._lock:
            for index in set(self._probes) & set(nvml_unhealthy):
                del self._probes[index]  # bad again: a later recovery probes afresh
        if command is None:
            return out
        for index in sorted(set(previously_out) - set(nvml_unhealthy)):
            reason = self._recovering(
                index, command, timeout, (inventory, vendor), now, retry_after
            )
            if reason is not None:
                out[index] = reason
        return out

    def _recovering(
        self,
        index: int,
        command: Sequence[str],
        timeout: float,
        gpus: _Gpus,
        now: float,
        retry_after: float,
    ) -> str | None:
        with self._lock:
            probe = self._probes.setdefault(index, _Probe())
            running = probe.thread is not None and probe.thread.is_alive()
            result = probe.result
        if running:
            return "recovering: re-test running"
        if result is not None and result.ok:
            with self._lock:
                del self._probes[index]
            self._log("gpu-recovered", {"gpu": index, "probe": "passed"})
            return None
        if result is not None and now < probe.retry_at:
            return f"re-test failed: {result.reason}"
        probe.result = None
        probe.retry_at = now + retry_after
        self._start(index, probe, command, timeout, gpus)
        return "recovering: re-test running"

    def _start(
        self,
        index: int,
        probe: _Probe,
        command: Sequence[str],
        timeout: float,
        gpus: _Gpus,
    ) -> None:
        env = probe_environment(self._base_env, index, *gpus)
        self._log("gpu-retest", {"gpu": index, "command": list(command), "timeout": timeout})

        def run() -> None:
            result = self._run_probe(env, timeout, command)
            if result.pid:
                reap_group(result.pid)  # helpers it left behind: we are their subreaper
            if not result.ok:
                self._log("gpu-retest-failed", {"gpu": index, "reason": result.reason})
            with self._lock:
                probe.result = result

        probe.thread = threading.Thread(target=run, name=f"re-test GPU {index}", daemon=True)
        probe.thread.start()
