"""Taking over the jobs an earlier agent recorded: what each of their workers is now.

Every job the state file names is tracked again, running or not: a worker
whose shim still runs is adopted; one whose shim ended stays tracked until
the supervisor reads how it ended from the shim's status file, so a clean
exit stays finished (it is never run again) and a crash counts as one; a
stop that was under way carries on. A job the agent died launching (some
worker never started) is reported, for the supervisor to restart it whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from allocator.agent import tree
from allocator.agent.runtime import JobRuntime, WorkerRuntime
from allocator.agent.statefile import job_from_state

__all__ = ["AdoptReport", "AdoptedWorker", "take_over"]


@dataclass(frozen=True, slots=True)
class AdoptedWorker:
    """What adoption decided for one recorded worker (see :func:`tree.adopt_worker`)."""

    job: str
    index: int
    pid: int
    outcome: str


@dataclass(frozen=True, slots=True)
class AdoptReport:
    """Jobs from the state file: adopted (running), ended (tracked for their exit), stale (bad)."""

    adopted: tuple[str, ...]
    stale: tuple[str, ...]
    workers: tuple[AdoptedWorker, ...]
    ended: tuple[str, ...] = ()
    half_started: tuple[str, ...] = ()  # some worker never started: restart the job whole


def take_over(
    entries: Mapping[str, Any],
    tracked: set[str],
    log: Callable[[str, dict[str, Any]], None],
) -> tuple[dict[str, JobRuntime], AdoptReport]:
    """Rebuild the recorded jobs not ``tracked`` already; an unreadable entry is stale."""
    jobs: dict[str, JobRuntime] = {}
    adopted: list[str] = []
    ended: list[str] = []
    stale: list[str] = []
    half: list[str] = []
    outcomes: list[AdoptedWorker] = []
    for name, entry in sorted(entries.items()):
        if name in tracked:
            continue
        try:
            job = job_from_state(entry)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log("adopt-skipped", {"job": name, "error": f"bad state entry: {exc}"})
            stale.append(name)
            continue
        found = [_adopt(name, worker) for worker in job.workers]
        outcomes.extend(found)
        jobs[name] = job
        running = any(w.outcome == "adopted" for w in found)
        (adopted if running else ended).append(name)
        if any(w.outcome == "never-started" for w in found):
            half.append(name)
    report = AdoptReport(tuple(adopted), tuple(stale), tuple(outcomes), tuple(ended), tuple(half))
    return jobs, report


def _adopt(job: str, worker: WorkerRuntime) -> AdoptedWorker:
    outcome = tree.adopt_worker(worker)  # may learn the pid (from the shim's status file)
    return AdoptedWorker(job, worker.spec.index, worker.pid, outcome)
