"""CPU use of a job's worker trees between two samples, for the idle rule's ``busy_cpu_percent``.

A job loading data or writing a checkpoint keeps its GPUs at 0 % while its
processes work hard on the CPU; an idle rule with ``busy_cpu_percent`` counts
such a sample as busy. The use is the CPU time every process of the job's
worker trees (each shim and everything below it) spent since the last
sample, as a percentage of the whole host's CPU time in that interval.

Reading the trees is the I/O edge (:func:`read_tree_times`, psutil); the
arithmetic is pure (:func:`cpu_percent`). Processes are told apart by pid
and start time, so a pid reused meanwhile is a new process, and a process
that ended between two samples simply drops out (its last interval is lost:
the estimate errs towards idle only for processes that just ended).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

__all__ = ["CpuTimes", "TreeCpu", "cpu_percent", "read_tree_times"]

#: CPU seconds (user + system) of each process of a tree, by (pid, start time).
CpuTimes = dict[tuple[int, float], float]


def read_tree_times(roots: Sequence[int]) -> CpuTimes:
    """The CPU seconds of each process in the trees under ``roots`` (gone ones left out)."""
    import psutil  # only for jobs whose rule asks: kept off the agent's start-up

    found: CpuTimes = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for process in tree:
            try:
                times = process.cpu_times()
                found[(process.pid, process.create_time())] = times.user + times.system
            except psutil.Error:
                continue  # ended while being read
    return found


def cpu_percent(before: CpuTimes, after: CpuTimes, seconds: float, cpus: int) -> float:
    """The share of ``cpus`` CPUs the processes used over ``seconds`` (pure)."""
    if seconds <= 0 or cpus <= 0:
        return 0.0
    used = sum(max(0.0, spent - before.get(process, 0.0)) for process, spent in after.items())
    return 100.0 * used / (seconds * cpus)


class TreeCpu:
    """Each job's CPU use since the previous sample; ``None`` until two samples exist."""

    def __init__(
        self,
        read: Callable[[Sequence[int]], CpuTimes] = read_tree_times,
        cpus: int | None = None,
    ) -> None:
        self._read = read
        self._cpus = cpus or os.cpu_count() or 1
        self._last: dict[str, tuple[float, CpuTimes]] = {}

    def sample(self, roots: Mapping[str, Sequence[int]], now: float) -> dict[str, float | None]:
        """Read the trees of ``roots`` (job -> shim pids) at monotonic ``now``."""
        result: dict[str, float | None] = {}
        last: dict[str, tuple[float, CpuTimes]] = {}
        for job, pids in roots.items():
            times = self._read(pids)
            previous = self._last.get(job)
            result[job] = (
                None
                if previous is None
                else cpu_percent(previous[1], times, now - previous[0], self._cpus)
            )
            last[job] = (now, times)
        self._last = last
        return result
