"""What the agent observes about GPU use, and what it exports: one object the loop calls.

At the health interval (never on every tick) :meth:`Observer.sample` reads
the usage the host's vendor samples (NVML's on NVIDIA; none elsewhere), finds
processes on GPUs they were not given (:mod:`allocator.agent.gpu_care.unassigned_use`),
tracks idle holders and decides what their rules ask
(:mod:`allocator.agent.gpu_care.idle`). The loop publishes the coarse,
change-driven results (``unassigned`` in the agent record, ``idle_since`` in
worker records) and hands ``releases`` to the store link; live numbers
(utilization, memory) go only to ``/metrics``, which an optional HTTP
server answers from :meth:`Observer.families` at scrape time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from allocator.agent.gpu_care.idle import IdleTracker, idle_actions
from allocator.agent.gpu_care.tree_cpu import TreeCpu
from allocator.agent.gpu_care.unassigned_use import (
    TreeRoot,
    describe_process,
    find_owners,
    steady_memory,
    unassigned_processes,
)
from allocator.agent.metrics import AgentMetricsState, agent_families
from allocator.agent.planning.job_phase import BackingOff, GaveUp, Stopping
from allocator.agent.planning.types import DesiredJob, IdleRelease, JobView
from allocator.errors import InvalidInput
from allocator.gpus.inventory import Inventory
from allocator.gpus.usage import GpuUsage, UsageSampler
from allocator.gpus.vendors.registry import vendor_named
from allocator.policy.model import IdleRule, Policy
from allocator.records.types import Assignment, GpuProcess
from allocator.status.metrics import Family, Histogram, start_metrics_server

__all__ = ["RECONCILE_BUCKETS", "Observer", "working"]

Log = Callable[[str, dict[str, Any]], None]
Roots = Mapping[str, Sequence[tuple[int, int | None, str, str]]]

#: Reconcile duration buckets, seconds: a reconcile is normally well under a millisecond.
RECONCILE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def working(view: JobView | None, gpus: Sequence[int]) -> bool:
    """Whether the job's workers all run now, on ``gpus``: the only time idleness counts.

    A job in crash backoff, given up, stopping, waiting (no workers: no
    view), or whose workers partly ended, reads 0 % without being idle.
    """
    return (
        view is not None
        and not isinstance(view.phase, Stopping | GaveUp | BackingOff)
        and bool(view.exit_codes)
        and all(code is None for code in view.exit_codes)
        and view.alive == len(view.exit_codes)
        and view.device == "cuda"
        and tuple(view.gpus) == tuple(gpus)
    )


def _at_least(measured: float | None, limit: float) -> bool:
    return measured is None or measured >= limit


class Observer:
    """GPU usage, unassigned processes, idle holders and metrics of one host's agent."""

    def __init__(
        self,
        environ: Mapping[str, str],
        host: str,
        log: Log,
        clock: Callable[[], float],
        vendor: str | None = None,
    ) -> None:
        """Prepare to sample through the library ``environ`` selects of ``vendor`` (the
        host's, NVIDIA's for ``None``); nothing is read yet. A vendor with no sampler
        gives no usage: no idle spells, no unassigned processes, no usage series."""
        self.host = host
        self.log = log
        self.clock = clock
        self.sampler: UsageSampler | None = vendor_named(vendor).usage_sampler(environ, clock)
        self.idle = IdleTracker()
        self.tree_cpu = TreeCpu()
        self.warned: set[str] = set()
        self.usage: tuple[GpuUsage, ...] | None = None
        self.unassigned: tuple[GpuProcess, ...] = ()
        self.idle_since: dict[str, str] = {}
        self.releases: tuple[IdleRelease, ...] = ()
        self.reconcile = Histogram(
            "allocator_reconcile_duration_seconds",
            "How long one reconcile (desired state, plan, actions) took.",
            RECONCILE_BUCKETS,
        )
        self._sample_error: str | None = None
        self._store_up = False
        self._store_down_since = clock()
        self._state = AgentMetricsState(host=host)
        self._lock = threading.Lock()
        self._stop_server: Callable[[], None] | None = None

    # --- metrics server -----------------------------------------------------------

    def serve_metrics(self, address: str, port: int) -> None:
        """Serve ``/metrics`` on ``address:port``; InvalidInput if it cannot be bound."""
        try:
            self._stop_server = start_metrics_server(self.families, address, port)
        except ImportError:
            raise InvalidInput(
                "--metrics-port needs prometheus-client: pip install 'gpu-allocator[metrics]'"
            ) from None
        except OSError as exc:
            raise InvalidInput(
                f"--metrics-port {port}: cannot listen on {address}:{port}: {exc.strerror or exc}"
            ) from None
        self.log("metrics", {"address": address, "port": port})

    def close(self) -> None:
        """Stop the metrics server and release NVML."""
        if self._stop_server is not None:
            self._stop_server()
            self._stop_server = None
        if self.sampler is not None:
            self.sampler.close()

    # --- what the loop tells it -----------------------------------------------------

    def store_state(self, connected: bool, now: float) -> None:
        """The store link came up or went down at ``now``."""
        if self._store_up and not connected:
            self._store_down_since = now
        self._store_up = connected

    def sample(
        self,
        now: float,
        wall: datetime,
        policy: Policy | None,
        desired: Mapping[str, DesiredJob],
        views: Mapping[str, JobView],
        roots: Roots,
        assignments: Mapping[str, Assignment],
        revisions: Mapping[str, int],
        unhealthy: Mapping[int, str],
    ) -> None:
        """One usage sample: unassigned processes, idle spells, and what the idle rules ask."""
        usage = self.sampler.sample() if self.sampler is not None else None
        self._note_sample_error()
        self.usage = usage
        rules = self._rules(policy, desired)
        running = {
            job: want.gpus
            for job, want in desired.items()
            if want.state == "run"
            and want.device == "cuda"
            and not set(want.gpus) & set(unhealthy)
            and working(views.get(job), want.gpus)
        }
        for job in self._cpu_busy(rules, running, roots, now):
            running.pop(job)  # busy on the CPU: its GPUs' 0 % is no idleness
        thresholds = {job: rule.threshold_percent for job, (rule, _) in rules.items()}
        self.idle.update(running, usage, thresholds, now, wall)
        after = {job: rule.after_seconds or math.inf for job, (rule, _) in rules.items()}
        self.idle_since = self.idle.published(now, after)
        actions = idle_actions(self.idle.idle_seconds(now), rules, revisions, self.warned)
        for job, reason in actions.warn:
            self.log("idle-holder", {"job": job, "reason": reason})
        self.releases = actions.release
        if usage is not None:
            self._find_unassigned(usage, views, roots, assignments)

    def _cpu_busy(
        self,
        rules: Mapping[str, tuple[IdleRule, str]],
        running: Mapping[str, Sequence[int]],
        roots: Roots,
        now: float,
    ) -> list[str]:
        """Jobs whose rule has ``busy_cpu_percent`` and that used that much CPU, or unknown yet.

        Only those jobs' trees are read. The first sample of a job measures
        nothing yet, and an unmeasured job is not judged idle.
        """
        limits = {
            job: rule.busy_cpu_percent
            for job, (rule, _) in rules.items()
            if rule.busy_cpu_percent is not None and job in running
        }
        shims = {job: [root[0] for root in roots.get(job, ())] for job in limits}
        used = self.tree_cpu.sample(shims, now)
        return [job for job, limit in limits.items() if _at_least(used.get(job), limit)]

    def _rules(
        self, policy: Policy | None, desired: Mapping[str, DesiredJob]
    ) -> dict[str, tuple[IdleRule, str]]:
        if policy is None:
            return {}
        found = {job: policy.idle_rule(job, self.host) for job in desired}
        return {job: rule for job, rule in found.items() if rule is not None}

    def _find_unassigned(
        self,
        usage: Sequence[GpuUsage],
        views: Mapping[str, JobView],
        roots: Roots,
        assignments: Mapping[str, Assignment],
    ) -> None:
        pids = {process.pid for gpu in usage for process in gpu.processes}
        tree_roots = {job: [TreeRoot(*root) for root in found] for job, found in roots.items()}
        for job, held in assignments.items():
            if held.host == self.host and held.run is not None:
                # `allocator run`'s process tree uses the GPUs it holds: not unassigned use.
                tree_roots.setdefault(job, []).append(TreeRoot(held.run.pid, held.run.start_ticks))
        owners = find_owners(pids, tree_roots) if pids else {}
        given: dict[str, set[int]] = {}
        for job, view in views.items():
            if view.device == "cuda":
                given.setdefault(job, set()).update(view.gpus)
        for job, held in assignments.items():
            if held.host == self.host and held.mode == "gpu":
                given.setdefault(job, set()).update(held.gpus)
        found = unassigned_processes(usage, given, owners, describe_process)
        found = steady_memory(self.unassigned, found)
        before = {(p.gpu, p.pid) for p in self.unassigned}
        for process in found:
            if (process.gpu, process.pid) not in before:
                fields = {"gpu": process.gpu, "pid": process.pid, "user": process.user}
                fields.update(command=process.command, job=process.job or "")
                self.log("unassigned-gpu-use", fields)
        self.unassigned = found

    def _note_sample_error(self) -> None:
        error = self.sampler.error if self.sampler is not None else None
        if error != self._sample_error:
            self._sample_error = error
            if error is None:
                self.log("nvml-usage-recovered", {})
            else:
                self.log("nvml-usage-failed", {"error": error})

    # --- metrics ---------------------------------------------------------------------

    def note(
        self,
        inventory: Inventory,
        unhealthy: Mapping[int, str],
        assignments: Mapping[str, Assignment],
        workers: Mapping[str, Mapping[str, Any]],
        version: str,
    ) -> None:
        """Record the agent's state for the next scrape (cheap: called every step)."""
        if self._stop_server is None:
            return
        holders: dict[int, list[str]] = {}
        for job, held in sorted(assignments.items()):
            if held.host == self.host and held.mode == "gpu":
                for gpu in held.gpus:
                    holders.setdefault(gpu, []).append(job)
        state = AgentMetricsState(
            host=self.host,
            version=version,
            uuids={gpu.index: gpu.uuid for gpu in inventory.gpus},
            unhealthy=dict(unhealthy),
            holders={gpu: tuple(jobs) for gpu, jobs in holders.items()},
            usage=self.usage,
            unassigned=self.unassigned,
            workers=dict(workers),
            store_up=self._store_up,
        )
        with self._lock:
            self._state = state

    def families(self) -> list[Family | Histogram]:
        """Every series, as of now (called from the metrics server's thread)."""
        now = self.clock()
        with self._lock:
            state = self._state
        idle = self.idle.idle_seconds(now)
        down = 0.0 if self._store_up else now - self._store_down_since
        state = replace(
            state, idle_seconds=idle, store_up=self._store_up, store_unreachable_seconds=down
        )
        return [*agent_families(state), self.reconcile]
