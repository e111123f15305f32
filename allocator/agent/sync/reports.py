"""What the agent publishes: its own record, one record per job and its GPU counts (pure)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from allocator.agent.planning.types import DesiredJob
from allocator.gpus.inventory import Inventory
from allocator.records.codec import decode_record, replace_struct
from allocator.records.types import AgentRecord, Assignment, GpuProcess, WorkerRecord
from allocator.status.host_count import count_host

__all__ = ["agent_record", "host_counts", "worker_records"]


def agent_record(
    host: str,
    inventory: Inventory,
    unhealthy: Mapping[int, str],
    *,
    started_at: str,
    version: str,
    address: str | None = None,
    unassigned: tuple[GpuProcess, ...] = (),
) -> AgentRecord:
    """The leased record: inventory, health, and the address other hosts reach it at.

    Nothing in it changes while the host is idle (no heartbeat time): the
    lease's keep-alive is the liveness signal, and the record is rewritten
    only when its content changes.
    """
    return AgentRecord(
        host=host,
        gpus=inventory.gpus,
        unhealthy=dict(sorted(unhealthy.items())),
        started_at=started_at,
        pid=os.getpid(),
        version=version,
        inventory_source=inventory.source,
        address=address,
        unassigned=unassigned,
        vendor=inventory.vendor,
    )


def worker_records(
    host: str,
    desired: Mapping[str, DesiredJob],
    running: Mapping[str, Mapping[str, Any]],
    idle_since: Mapping[str, str] | None = None,
    held_back: Mapping[str, str] | None = None,
) -> dict[str, bytes]:
    """One encoded :class:`WorkerRecord` per job that runs or is held back.

    ``idle_since`` gives, per idle job, when its GPUs went idle; ``held_back``
    what a finished share of a job across hosts says instead of its release
    (waiting for the other shares, or another share's crash is the result).
    """
    out: dict[str, bytes] = {}
    for job in sorted(set(desired) | set(running)):
        want = desired.get(job)
        have = running.get(job)
        if have is not None:
            record = _with_rendezvous(_from_runtime(host, job, want, have), want)
        elif want is not None and want.state != "run":
            record = WorkerRecord(
                job=job,
                host=host,
                state=want.state,
                gpus=want.gpus,
                device=want.device,
                message=want.message,
                fallback_reason=want.fallback_reason,
                assignment_revision=want.assignment_revision,
                fault=want.fault,
            )
        else:
            continue
        if idle_since and job in idle_since:
            record = replace_struct(record, idle_since=idle_since[job])
        if held_back and job in held_back and have is not None:
            record = replace_struct(record, message=held_back[job])
        out[job] = record.to_json()
    return out


def _with_rendezvous(record: WorkerRecord, want: DesiredJob | None) -> WorkerRecord:
    """The record with the MASTER_ADDR/MASTER_PORT its workers run with, if any."""
    env = want.workers[0].env if want is not None and want.workers else {}
    port = env.get("MASTER_PORT", "")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return record
    return replace_struct(record, master_addr=env.get("MASTER_ADDR"), master_port=int(port))


def _from_runtime(
    host: str, job: str, want: DesiredJob | None, have: Mapping[str, Any]
) -> WorkerRecord:
    message = want.message if want is not None else "not assigned: stopping"
    if want is not None and want.state == "run":  # plus what happened to the workers
        message = "; ".join(m for m in (want.message, str(have.get("message", ""))) if m)
    last_exit = have.get("last_exit")
    return WorkerRecord(
        job=job,
        host=host,
        state=str(have.get("state", "unknown")),
        pids=tuple(int(p) for p in have.get("pids", ())),
        gpus=tuple(int(g) for g in have.get("gpus", ())),
        device="cpu" if have.get("device") == "cpu" else "cuda",
        since=str(have.get("since", "")),
        restarts=int(have.get("restarts", 0)),
        crash_restarts=int(have.get("crash_restarts", 0)),
        last_exit=int(last_exit) if last_exit is not None else None,
        fallback_reason=have.get("fallback_reason"),
        message=message,
        start_times=tuple(float(t) for t in have.get("start_times", ())),
        assignment_revision=want.assignment_revision if want is not None else 0,
        fault=want.fault if want is not None else None,
        output_tail=tuple(str(line) for line in have.get("output_tail", ())),
        log_path=str(have.get("log_path") or "") or None,
    )


def host_counts(
    agent: AgentRecord,
    workers: Mapping[str, bytes],
    assignments: Mapping[str, Assignment],
    utilisation: int | None = None,
) -> bytes | None:
    """The host's GPU counts for ``status --summary``; ``None`` when no GPU was found.

    Counted as the summary counts a host from its records (one rule,
    :func:`allocator.status.host_count.count_host`), from what the agent
    publishes (``workers``, encoded) and the assignments it last read. A
    host without an inventory keeps no counts: the summary then counts the
    GPUs its policy entry declares, from the host's records. ``utilisation``:
    the mean to report (:mod:`allocator.agent.sync.utilisation_report`).
    """
    if not agent.gpus:
        return None
    decoded = {job: decode_record(raw, WorkerRecord) for job, raw in workers.items()}
    indices = [gpu.index for gpu in agent.gpus]
    counted = count_host(agent.host, assignments, decoded, indices, agent.unhealthy)
    return replace_struct(counted, utilisation=utilisation).to_json()
