"""A simulated fleet in a store: a 1,000-host policy, its assignments, agents and workers.

:func:`fleet_policy` writes the policy of ``hosts`` hosts of ``gpus`` GPUs
each; :func:`load_fleet` applies it and writes, for every host, the
records a running fleet has: ``jobs_per_host`` assignments (one GPU each,
with their job index entries), the agent's leased record and counts
(``counts/<host>``, what ``status --summary`` adds up) and a worker
record per job. Records are built with allocator's own record types, so
every reader decodes them strictly, as it would a real fleet's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from allocator.agent.sync.reports import host_counts
from allocator.control.client import Allocator
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, JobIndex, WorkerRecord
from allocator.store import MAX_TXN_OPS, Op, Put, Store

__all__ = [
    "Fleet",
    "busy_policy",
    "fleet_policy",
    "host_name",
    "host_records",
    "job_name",
    "load_fleet",
    "write_busy_fleet",
]

_WHEN = "2026-11-30T00:00:00Z"


def host_name(index: int) -> str:
    """The name of host number ``index``."""
    return f"node{index:04d}"


def job_name(host: int, slot: int) -> str:
    """The job holding GPU ``slot`` of host number ``host``."""
    return f"job{host:04d}-{slot}"


def fleet_policy(hosts: int, gpus: int = 8, comment: str = "") -> str:
    """The YAML of a policy with ``hosts`` hosts of ``gpus`` GPUs, one job template."""
    lines = [f"# simulated fleet {comment}".rstrip(), "version: 1", "hosts:"]
    lines += [f"  {host_name(h)}: {{gpus: {gpus}}}" for h in range(hosts)]
    lines += [
        "jobs:",
        "  train:",
        "    command: [python, -m, train]",
        "    fallback: wait",
        "fallback:",
        "  wait: {action: wait}",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Fleet:
    """What :func:`load_fleet` wrote."""

    hosts: int
    gpus: int
    jobs_per_host: int
    prefix: str
    policy_revision: int
    keys: int


def host_records(
    layout: KeyLayout, host: int, gpus: int, jobs: int, revision: int, lease: int
) -> Iterator[Op]:
    """Host number ``host``'s records: its agent and its counts (under ``lease``), ``jobs`` jobs.

    Each job holds one GPU, with its worker record.
    """
    name = host_name(host)
    inventory = tuple(GpuInfo(index=g, uuid=f"GPU-{host:08x}-{g:04x}") for g in range(gpus))
    agent = AgentRecord(host=name, gpus=inventory, started_at=_WHEN, pid=1000 + host)
    yield Put(layout.agent(name), agent.to_json(), lease)
    yield Put(layout.host_generation(name), b"1")
    held: dict[str, Assignment] = {}
    workers: dict[str, bytes] = {}
    for slot in range(jobs):
        job = job_name(host, slot)
        assignment = Assignment(
            job=job,
            host=name,
            gpus=(slot,),
            mode="gpu",
            updated_by="bench@fleet",
            updated_at=_WHEN,
            requested=f"gpus={slot}",
            policy_revision=revision,
        )
        held[job] = assignment
        yield Put(layout.assignment(name, job), assignment.to_json())
        yield Put(layout.job_index(job), JobIndex(job=job, hosts=(name,)).to_json())
        worker = WorkerRecord(
            job=job, host=name, state="running", pids=(20000 + slot,), gpus=(slot,), since=_WHEN
        )
        workers[job] = worker.to_json()
        yield Put(layout.workers(name, job), workers[job])
    counts = host_counts(agent, workers, held)  # what its agent keeps for status --summary
    if counts is not None:
        yield Put(layout.host_counts(name), counts, lease)


def _batches(ops: Iterator[Op], size: int) -> Iterator[Sequence[Op]]:
    batch: list[Op] = []
    for op in ops:
        batch.append(op)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def load_fleet(
    store: Store,
    prefix: str,
    hosts: int = 1000,
    gpus: int = 8,
    jobs_per_host: int = 6,
    policy: str | None = None,
    batch: int = MAX_TXN_OPS,
) -> Fleet:
    """Apply the fleet's policy and write every host's records (see the module doc).

    ``policy``: its YAML, when not :func:`fleet_policy`'s (a range, say);
    ``batch``: writes per transaction (SQLite takes any number: a few large
    transactions write 100,000 keys in a few seconds, 64 at a time about four times as long).
    """
    allocator = Allocator(store, prefix=prefix, actor="bench@fleet")
    applied = allocator.apply_policy(policy or fleet_policy(hosts, gpus), "fleet.yaml")
    revision = applied.revision
    lease = store.grant_lease(3600)
    layout = allocator.layout
    ops = (
        op
        for host in range(hosts)
        for op in host_records(layout, host, gpus, jobs_per_host, revision, lease)
    )
    keys = 0
    for writes in _batches(ops, batch):
        store.txn([], writes)
        keys += len(writes)
    return Fleet(hosts, gpus, jobs_per_host, prefix, revision, keys)


def busy_policy(hosts: int) -> str:
    """Two pools of host ranges (the first three fifths ``a100``, with an idle rule), 8 GPUs."""
    split = hosts * 3 // 5
    return (
        "version: 1\nhosts:\n"
        f"  node[0000-{split - 1:04d}]: {{gpus: 8, pool: a100}}\n"
        f"  node[{split:04d}-{hosts - 1:04d}]: {{gpus: 8, pool: h100}}\n"
        "pools:\n  a100: {idle: {after: 2h, action: warn}}\n  h100: {}\n"
        "jobs:\n  train: {command: [python, -m, train]}\n"
    )


#: Writes per transaction of :func:`write_busy_fleet` (SQLite takes any number).
_SQLITE_BATCH = 5000


def write_busy_fleet(url: str, prefix: str, hosts: int) -> None:
    """A SQLite store (``url``) of ``hosts`` hosts as a status page sees a busy fleet.

    Every host has 2 one-GPU jobs (:func:`host_records`); a scattered,
    repeatable few have 7, an unhealthy GPU, a process nobody was given, or an
    idle job. Written a few large transactions at a time: 12,500 hosts (about
    113,000 keys) take a few seconds.
    """
    from datetime import timedelta

    from allocator.records.types import GpuProcess
    from allocator.store import open_store
    from allocator.util.times import format_time, utc_now

    store = open_store(url, create=True)
    try:
        fleet = load_fleet(store, prefix, hosts, 8, 2, busy_policy(hosts), _SQLITE_BATCH)
        layout, lease = KeyLayout(prefix), store.grant_lease(3600)
        idle_since = format_time(utc_now() - timedelta(hours=3))
        ops: list[Op] = []
        for host in range(hosts):
            kind, name = (host * 2654435761 % 2**32 >> 16) % 23, host_name(host)  # scattered
            gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{host:08x}-{g:04x}") for g in range(8))
            if kind < 6:
                ops += host_records(layout, host, 8, 7, fleet.policy_revision, lease)
            elif kind == 6:
                agent = AgentRecord(host=name, gpus=gpus, unhealthy={5: "Xid 79"})
                ops.append(Put(layout.agent(name), agent.to_json(), lease))
            elif kind == 7:
                stray = GpuProcess(gpu=6, pid=4242, user="bob", command="python notebook.py")
                agent = AgentRecord(host=name, gpus=gpus, unassigned=(stray,))
                ops.append(Put(layout.agent(name), agent.to_json(), lease))
            elif kind == 8:
                job = job_name(host, 0)
                worker = WorkerRecord(
                    job=job, host=name, state="running", pids=(1,), gpus=(0,), idle_since=idle_since
                )
                ops.append(Put(layout.workers(name, job), worker.to_json()))
        for writes in _batches(iter(ops), _SQLITE_BATCH):
            store.txn([], writes)
    finally:
        store.close()
