"""The checker of a fault run: replays what was recorded and names every violation.

In the manner of etcd's robustness tests and Jepsen's analyses, the run
itself only records; this module decides, with pure functions over plain
data, after the run. What it reads:

* the store's history entries (``allocator history -o json``), ordered by
  store revision: every change of an assignment is written in the same
  transaction as its entry, so they are the assignments' own order;
* the workers' journal (``journal_worker.py``): each worker's start (job,
  host, GPUs, time) and end (stopped, or finished by itself with status 0);
  a worker with no end line has a ``gone_by`` time when it was seen dead,
  else it ran until the end of the observation;
* each client's operations, timed from before the command was started to
  after it returned (``code`` is ``None`` when it never returned);
* the agents' acknowledgements: their worker records, sampled during the
  run, naming the PIDs they say run each job.

The properties (each function returns its violations; none means it held):

* :func:`holdings_held_twice`: no GPU of a host is held by two jobs at once
  in the store's own history;
* :func:`workers_held_twice`: no two workers of different jobs run on one
  GPU of a host at the same time;
* :func:`duplicate_workers`: no two workers of one job on one host run at
  the same time;
* :func:`jobs_run_twice`: a job whose worker finished (status 0, by
  itself) starts again only after a ``set`` that may have been written
  after that finish (a ``set`` that returned before the finish cannot be);
* :func:`workers_lost`: every PID an agent acknowledged as running (in
  samples at least ``settle`` seconds apart, so a worker stopped before it
  could journal its start is not counted) started a worker of that job;
* :func:`assignments_unserved`: once the clients are done, every job that
  runs until stopped and holds an assignment has a live worker on its GPUs.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Ack",
    "Change",
    "ClientOp",
    "Span",
    "Violation",
    "assignments_unserved",
    "changes_from_history",
    "duplicate_workers",
    "holdings_held_twice",
    "jobs_run_twice",
    "spans_from_journal",
    "workers_held_twice",
    "workers_lost",
]

#: Exit codes after which a command certainly wrote nothing (invalid, conflict,
#: permission, not found). Any other ending (0, 1, 4, killed) may have written.
_CERTAINLY_NOT_WRITTEN = frozenset({2, 3, 5, 6})
#: History actions that change who holds which GPUs.
_HOLDING_ACTIONS = frozenset({"set", "move", "release", "expired"})


@dataclass(frozen=True)
class Violation:
    """One broken property: which, and what shows it."""

    prop: str
    detail: str


@dataclass(frozen=True)
class Change:
    """One history entry that changed a job's GPUs on a host (``gpus`` after it)."""

    revision: int
    action: str
    host: str
    job: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Span:
    """One worker's life: from its start to its end (``None``: still running at the end)."""

    pid: int
    host: str
    job: str
    gpus: tuple[int, ...]
    start: float
    end: float | None
    finished: bool = False


@dataclass(frozen=True)
class ClientOp:
    """One client command: ``invoke`` before it started, ``complete`` after it returned."""

    kind: str
    host: str
    job: str
    invoke: float
    complete: float | None
    code: int | None

    def may_have_written_after(self, moment: float) -> bool:
        """Whether this command may have written its change after ``moment``."""
        if self.code in _CERTAINLY_NOT_WRITTEN:
            return False
        return self.complete is None or self.complete > moment


@dataclass(frozen=True)
class Ack:
    """An agent's worker record as sampled at ``at``: the PIDs it says run ``job``."""

    at: float
    host: str
    job: str
    state: str
    pids: tuple[int, ...]


def changes_from_history(entries: Iterable[dict[str, Any]]) -> list[Change]:
    """The holding changes among ``history -o json`` entries, oldest first."""
    changes = []
    for entry in entries:
        if entry.get("action") not in _HOLDING_ACTIONS or not entry.get("host"):
            continue
        to = entry.get("to") or {}
        gpus = tuple(int(g) for g in to.get("gpus", ()))
        changes.append(
            Change(int(entry["revision"]), entry["action"], entry["host"], entry["job"], gpus)
        )
    return sorted(changes, key=lambda change: change.revision)


def spans_from_journal(
    lines: Iterable[dict[str, Any]], gone_by: dict[int, float] | None = None
) -> list[Span]:
    """Workers' lives from their journal lines (and when the silent ones were seen dead)."""
    starts: dict[int, dict[str, Any]] = {}
    ends: dict[int, dict[str, Any]] = {}
    for line in lines:
        (starts if line["event"] == "start" else ends)[int(line["pid"])] = line
    spans = []
    for pid, start in starts.items():
        end = ends.get(pid)
        ended = end["time"] if end else (gone_by or {}).get(pid)
        spans.append(
            Span(
                pid,
                start["host"],
                start["job"],
                tuple(start["gpus"]),
                float(start["time"]),
                None if ended is None else float(ended),
                finished=bool(end) and end["how"] == "exit",
            )
        )
    return sorted(spans, key=lambda span: span.start)


def holdings_held_twice(changes: Sequence[Change]) -> list[Violation]:
    """Replay the changes in revision order; report every GPU taken while another job held it."""
    held: dict[tuple[str, int], str] = {}
    of_job: dict[tuple[str, str], tuple[int, ...]] = {}
    found = []
    for change in sorted(changes, key=lambda c: c.revision):
        for gpu in of_job.pop((change.host, change.job), ()):
            held.pop((change.host, gpu), None)
        for gpu in change.gpus:
            other = held.get((change.host, gpu))
            if other is not None:
                found.append(
                    Violation(
                        "gpu-held-twice",
                        f"revision {change.revision}: {change.action} gave GPU {gpu} of "
                        f"{change.host} to {change.job} while {other} held it",
                    )
                )
            held[(change.host, gpu)] = change.job
        if change.gpus:
            of_job[(change.host, change.job)] = change.gpus
    return found


def _overlap(a: Span, b: Span, until: float) -> bool:
    a_end = until if a.end is None else a.end
    b_end = until if b.end is None else b.end
    return a.start < b_end and b.start < a_end


def workers_held_twice(spans: Sequence[Span], until: float) -> list[Violation]:
    """Workers of different jobs on one GPU of a host whose lives overlap."""
    by_gpu: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for span in spans:
        for gpu in span.gpus:
            by_gpu[(span.host, gpu)].append(span)
    found = []
    for (host, gpu), on_gpu in sorted(by_gpu.items()):
        for a, b in itertools.combinations(on_gpu, 2):
            if a.job != b.job and _overlap(a, b, until):
                found.append(
                    Violation(
                        "gpu-held-twice",
                        f"GPU {gpu} of {host}: {_describe(a)} and {_describe(b)} ran at once",
                    )
                )
    return found


def duplicate_workers(spans: Sequence[Span], until: float) -> list[Violation]:
    """Two workers of one job on one host whose lives overlap."""
    found = []
    for (host, job), of_job in _by_job(spans).items():
        for a, b in itertools.combinations(of_job, 2):
            if _overlap(a, b, until):
                found.append(
                    Violation(
                        "duplicate-worker",
                        f"{job}@{host}: {_describe(a)} and {_describe(b)} ran at once",
                    )
                )
    return found


def jobs_run_twice(spans: Sequence[Span], ops: Sequence[ClientOp]) -> list[Violation]:
    """A worker started after its job finished, with no ``set`` that may have come after."""
    sets: dict[tuple[str, str], list[ClientOp]] = defaultdict(list)
    for op in ops:
        if op.kind == "set":
            sets[(op.host, op.job)].append(op)
    found = []
    for key, of_job in _by_job(spans).items():
        for done in (s for s in of_job if s.finished and s.end is not None):
            finish = done.end
            assert finish is not None
            for later in (s for s in of_job if s.start > finish):
                if not any(
                    op.may_have_written_after(finish) and op.invoke < later.start
                    for op in sets[key]
                ):
                    found.append(
                        Violation(
                            "job-run-twice",
                            f"{key[1]}@{key[0]}: {_describe(later)} started after "
                            f"{_describe(done)} finished, with no set since",
                        )
                    )
    return found


def workers_lost(acks: Sequence[Ack], spans: Sequence[Span], settle: float) -> list[Violation]:
    """PIDs an agent acknowledged as running (for ``settle`` seconds) that started no worker."""
    seen: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for ack in acks:
        if ack.state == "running":
            for pid in ack.pids:
                seen[(ack.host, ack.job, pid)].append(ack.at)
    started = {(s.host, s.job, s.pid) for s in spans}
    found = []
    for (host, job, pid), times in sorted(seen.items()):
        if max(times) - min(times) >= settle and (host, job, pid) not in started:
            found.append(
                Violation(
                    "worker-lost",
                    f"{job}@{host}: the agent said PID {pid} ran it for "
                    f"{max(times) - min(times):.1f} s; no such worker ever started",
                )
            )
    return found


def assignments_unserved(
    assigned: Mapping[tuple[str, str], tuple[int, ...]], spans: Sequence[Span]
) -> list[Violation]:
    """Assignments (``(host, job)``: GPUs) with no live worker of that job on those GPUs."""
    live = _by_job(s for s in spans if s.end is None)
    found = []
    for (host, job), gpus in sorted(assigned.items()):
        if not any(span.gpus == gpus for span in live.get((host, job), ())):
            running = ", ".join(_describe(span) for span in live.get((host, job), ())) or "none"
            found.append(
                Violation(
                    "worker-lost",
                    f"{job}@{host} holds GPUs {','.join(map(str, gpus))}; live workers: {running}",
                )
            )
    return found


def _by_job(spans: Iterable[Span]) -> dict[tuple[str, str], list[Span]]:
    by_job: dict[tuple[str, str], list[Span]] = defaultdict(list)
    for span in spans:
        by_job[(span.host, span.job)].append(span)
    return by_job


def _describe(span: Span) -> str:
    end = "running" if span.end is None else f"{span.end:.3f}"
    gpus = ",".join(map(str, span.gpus)) or "none"
    return f"PID {span.pid} ({span.job}, GPUs {gpus}, {span.start:.3f}-{end})"
