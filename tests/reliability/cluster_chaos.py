"""The fault run on a 3-member etcd cluster: workload, faults and observation.

Two real agents (hosts ``nodeA`` and ``nodeB``, four fake GPUs each) run
the policy's jobs as ``journal_worker.py`` processes; eight
``chaos_client.py`` processes drive the real CLI (``set``, ``release``,
``run``, ``run --wait``) against all three endpoints; meanwhile the leader
is SIGKILLed (and started again) or a member SIGSTOPped for 1-3 s, every
1-3 s. A sampler thread reads the agents' worker records (their
acknowledgements), a watcher thread notes when journalled workers that
left no end line were seen dead. When the clients are done, the agents get
to converge, and the history is read back. :class:`Observed` is all of
it; the checker (``tests/support/chaos_check.py``) judges it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, WorkerRecord
from allocator.store import open_store
from tests.e2e.agent_harness import AgentHarness, hosts_of, pid_alive
from tests.support.chaos_check import (
    Ack,
    Change,
    ClientOp,
    Span,
    Violation,
    assignments_unserved,
    changes_from_history,
    spans_from_journal,
)
from tests.support.etcd_cluster import EtcdCluster

SUPPORT = Path(__file__).resolve().parents[1] / "support"
JOURNAL_WORKER = SUPPORT / "journal_worker.py"
CLIENT = SUPPORT / "chaos_client.py"
HOSTS = ("nodeA", "nodeB")
GPUS = 4
CLIENTS = 8
#: Per host: two jobs that run until stopped, one that finishes after a second.
LONG_JOBS, FINITE_JOBS = ("long0", "long1"), ("once",)
SAMPLE_EVERY_S = 0.25
WATCH_EVERY_S = 0.05
CLIENTS_DONE_S = 120.0
#: How long the agents get, once the clients are done, to run what is assigned.
CONVERGE_S = 30.0


@dataclass
class Observed:
    """Everything the run recorded, for the checker."""

    changes: list[Change] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    ops: list[ClientOp] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    until: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    history: list[dict[str, Any]] = field(default_factory=list)
    unserved: list[Violation] = field(default_factory=list)
    seed: int = 0
    converged_s: float = 0.0


def job_name(host: str, job: str) -> str:
    """The policy's name for ``job`` on ``host`` (each host has jobs of its own)."""
    return f"{host.lower()}-{job}"


def chaos_policy(journal: Path) -> dict[str, Any]:
    """Two hosts of four GPUs; per host, long-running jobs and one that finishes."""
    worker = [sys.executable, str(JOURNAL_WORKER), "--journal", str(journal)]
    jobs: dict[str, Any] = {}
    for host in HOSTS:
        for job in LONG_JOBS:
            jobs[job_name(host, job)] = {"command": worker, "grace_seconds": 1}
        for job in FINITE_JOBS:
            jobs[job_name(host, job)] = {
                "command": [*worker, "--exit-after", "1"],
                "grace_seconds": 1,
            }
    return {
        "version": 1,
        "hosts": {host: {"gpus": GPUS} for host in HOSTS},
        "jobs": jobs,
    }


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Every complete line of the workers' journal."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        with suppress(ValueError):
            lines.append(json.loads(raw))
    return lines


class Sampler(threading.Thread):
    """Reads the agents' worker records (their acknowledgements) until stopped."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(daemon=True)
        self.url, self.layout = url, KeyLayout(prefix)
        self.acks: list[Ack] = []
        self.done = threading.Event()

    def run(self) -> None:
        store = open_store(self.url)
        try:
            while not self.done.wait(SAMPLE_EVERY_S):
                self.sample(store)
        finally:
            store.close()

    def sample(self, store: Any) -> None:
        """One look at the worker records of each host."""
        for host in HOSTS:
            with suppress(Exception):  # the store may be away: the next look will do
                listing = store.list(self.layout.host_workers(host))
                now = time.time()
                for item in listing.items:
                    with suppress(Exception):
                        record = WorkerRecord.from_json(item.value)
                        self.acks.append(Ack(now, host, record.job, record.state, record.pids))


class Watcher(threading.Thread):
    """Notes when a journalled worker that left no end line is seen dead, until stopped.

    Apart from the sampler, whose store reads may hang while a member is
    frozen: the moment a silent worker was seen gone is the end the checker
    gives it, so it must be looked for often.
    """

    def __init__(self, journal: Path) -> None:
        super().__init__(daemon=True)
        self.journal = journal
        self.gone_by: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(WATCH_EVERY_S):
            lines = read_journal(self.journal)
            ended = {line["pid"] for line in lines if line["event"] == "end"}
            for line in lines:
                pid = line["pid"]
                if pid not in ended and pid not in self.gone_by and not pid_alive(pid):
                    self.gone_by[pid] = time.time()


def _long_assignments(store: Any, layout: KeyLayout) -> dict[tuple[str, str], tuple[int, ...]]:
    """What the jobs that run until stopped hold now."""
    long_jobs = {job_name(host, job) for host in HOSTS for job in LONG_JOBS}
    held = {}
    for host in HOSTS:
        for item in store.list(layout.host_jobs(host)).items:
            assignment = Assignment.from_json(item.value)
            if assignment.job in long_jobs:
                held[(host, assignment.job)] = tuple(assignment.gpus)
    return held


def _converge(url: str, prefix: str, watcher: Watcher) -> tuple[list[Violation], float]:
    """Poll until every long job's assignment has its live worker; what is left, and how long."""
    store = open_store(url)
    began = time.monotonic()
    try:
        while True:
            spans = spans_from_journal(read_journal(watcher.journal), dict(watcher.gone_by))
            left = assignments_unserved(_long_assignments(store, KeyLayout(prefix)), spans)
            if not left or time.monotonic() - began > CONVERGE_S:
                return left, time.monotonic() - began
            time.sleep(SAMPLE_EVERY_S)
    finally:
        store.close()


def _inflict(cluster: EtcdCluster, rng: random.Random, faults: Counter[str]) -> None:
    """One fault: kill the leader (started again), or freeze a member for 1-3 s."""
    if rng.random() < 0.5:
        cluster.kill_leader()
        faults["leader SIGKILL + restart"] += 1
        return
    member = rng.choice(cluster.members)
    member.pause()
    try:
        time.sleep(rng.uniform(1.0, 3.0))  # the freeze itself, not a wait for something
    finally:
        member.resume()
    faults["member SIGSTOP 1-3 s"] += 1


def _start_clients(
    world: AgentHarness, workdir: Path, journal: Path, until: float, seed: int
) -> list[subprocess.Popen[bytes]]:
    jobs = ",".join(
        f"{host}:{job_name(host, job)}" for host in HOSTS for job in (*LONG_JOBS, *FINITE_JOBS)
    )
    worker = [sys.executable, str(JOURNAL_WORKER), "--journal", str(journal)]
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(CLIENT),
                f"--seed={seed * 100 + n}",
                f"--until={until}",
                f"--log={workdir / f'client{n}.jsonl'}",
                f"--hosts={','.join(HOSTS)}",
                f"--jobs={jobs}",
                f"--gpus={GPUS}",
                "--worker",
                *worker,
            ],
            env=world.env,
            stdin=subprocess.DEVNULL,
        )
        for n in range(CLIENTS)
    ]


def _client_ops(workdir: Path) -> list[ClientOp]:
    ops = []
    for n in range(CLIENTS):
        for line in read_journal(workdir / f"client{n}.jsonl"):
            ops.append(
                ClientOp(
                    line["kind"],
                    line["host"],
                    line["job"],
                    line["invoke"],
                    line["complete"],
                    line["code"],
                )
            )
    return ops


@contextmanager
def chaos_world(
    workdir: Path, prefix: str
) -> Iterator[tuple[EtcdCluster, dict[str, AgentHarness]]]:
    """The cluster, the policy applied and both agents started; all stopped after."""
    cluster = EtcdCluster(workdir / "etcd")
    cluster.start()
    try:
        with hosts_of(workdir, cluster.url, prefix, HOSTS, gpus=GPUS) as agents:
            first = agents[HOSTS[0]]
            first.apply_policy(chaos_policy(workdir / "journal.jsonl"))
            for agent in agents.values():
                agent.start_agent()
            yield cluster, agents
    finally:
        cluster.stop()


def run_chaos(workdir: Path, prefix: str, fault_seconds: float, seed: int) -> Observed:
    """The whole run: workload and faults for ``fault_seconds``, then the record of it."""
    journal = workdir / "journal.jsonl"
    rng = random.Random(seed)
    seen = Observed(seed=seed)
    with chaos_world(workdir, prefix) as (cluster, agents):
        world = agents[HOSTS[0]]
        sampler, watcher = Sampler(cluster.url, prefix), Watcher(journal)
        sampler.start()
        watcher.start()
        until = time.time() + fault_seconds
        clients = _start_clients(world, workdir, journal, until, seed)
        try:
            while time.time() < until:
                time.sleep(rng.uniform(1.0, 3.0))  # the calm between faults
                _inflict(cluster, rng, seen.faults)
            for client in clients:
                client.wait(CLIENTS_DONE_S)
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                    client.wait(10)
        seen.unserved, seen.converged_s = _converge(cluster.url, prefix, watcher)
        for thread in (sampler, watcher):
            thread.done.set()
            thread.join(30)
        for agent in agents.values():
            assert agent.process is not None and agent.process.poll() is None, agent.log_text()
        history = world.cli("history", "-o", "json", "--limit", "100000")
        assert history.code == 0, history.err
        seen.history = json.loads(history.out)["entries"]
        seen.until = time.time()
        seen.changes = changes_from_history(seen.history)
        seen.spans = spans_from_journal(read_journal(journal), watcher.gone_by)
        seen.ops = _client_ops(workdir)
        seen.acks = sampler.acks
    return seen
