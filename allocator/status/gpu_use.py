"""GPU use in ``status``: idle holders and processes on GPUs nobody was given (pure).

Agents publish coarse facts (a job's ``idle_since``, the processes on GPUs
they were not given); status turns them into what an operator reads, judged
against the applied policy's idle rules at ``now``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from allocator.policy import Policy
from allocator.records.types import AgentRecord, WorkerRecord
from allocator.util.durations import duration_text, format_duration
from allocator.util.times import parse_time

__all__ = ["IdleInfo", "describe_unassigned", "idle_info", "unassigned_by_gpu", "unassigned_on"]


class IdleInfo(msgspec.Struct, frozen=True):
    """A job's idle state as status shows it."""

    since: str | None = None  # RFC 3339, as the agent published it
    seconds: float | None = None
    rule: str = ""  # "release after 2h (pool a100)"
    holder: bool = False  # idle past its rule's ``after``

    @property
    def label(self) -> str:
        """``2h03m`` (empty while busy): the IDLE column."""
        return format_duration(self.seconds) if self.seconds is not None else ""


def idle_info(
    policy: Policy | None, host: str, job: str, worker: WorkerRecord | None, now: datetime
) -> IdleInfo:
    """How long ``job``'s GPUs on ``host`` have been idle, and whether its rule applies."""
    found = policy.idle_rule(job, host) if policy is not None else None
    rule_text = ""
    after: float | None = None
    if found is not None and found[0].after_seconds is not None:
        rule, source = found
        after = rule.after_seconds
        rule_text = f"{rule.action} after {duration_text(rule.after_seconds or 0)} ({source})"
    since = worker.idle_since if worker is not None else None
    started = parse_time(since) if since else None
    if started is None or started.tzinfo is None:
        return IdleInfo(rule=rule_text)
    seconds = max(0.0, (now - started).total_seconds())
    return IdleInfo(since, seconds, rule_text, after is not None and seconds >= after)


def unassigned_on(agent: AgentRecord | None, gpu: int) -> tuple[dict[str, Any], ...]:
    """The processes the host's agent found on ``gpu`` that no job there was given."""
    if agent is None:
        return ()
    return tuple(
        {
            "pid": p.pid,
            "user": p.user or None,
            "command": p.command or None,
            "memory_used_mib": p.memory_used_mib,
            "job": p.job,
        }
        for p in agent.unassigned
        if p.gpu == gpu
    )


def unassigned_by_gpu(agent: AgentRecord | None) -> dict[int, tuple[dict[str, Any], ...]]:
    """:func:`unassigned_on` for every GPU the agent found such processes on, at once."""
    if agent is None or not agent.unassigned:
        return {}
    return {gpu: unassigned_on(agent, gpu) for gpu in {p.gpu for p in agent.unassigned}}


def describe_unassigned(host: str, gpu: str, process: dict[str, Any]) -> str:
    """One line for the text table: ``node1 GPU 1: pid 4242 bob (python x.py), 4096 MiB``."""
    who = process["user"] or "user unknown"
    what = f" ({process['command']})" if process["command"] else " (not visible to the agent)"
    memory = process["memory_used_mib"]
    used = f", {memory} MiB" if memory is not None else ""
    job = f", a process of job {process['job']} (not given this GPU)" if process["job"] else ""
    return f"{host} GPU {gpu}: pid {process['pid']} {who}{what}{used}{job}"
