"""What should run on this host: policy + assignments + GPU health -> desired jobs.

Pure: everything it needs is passed in, nothing is read or written. The
command a worker runs comes from the reviewed policy; an assignment may carry
its own command only where the policy's job allows ad-hoc commands. On an
exclusive host no two jobs run on one GPU (:mod:`allocator.agent.planning.exclusive_claims`),
and a job held back by the flap limit (:mod:`allocator.agent.gpu_care.hold_down`)
stays in its fallback. A share of a job across several hosts follows the
other shares' faults (:mod:`allocator.agent.planning.across_hosts`): the job's fallback
rule decides for every host. Workers on shared GPUs are told their share
(:mod:`allocator.agent.planning.gpu_shares`) and every worker is pinned to its CPUs
(:mod:`allocator.agent.planning.affinity`). What a running job's workers are is
:mod:`allocator.agent.planning.worker_specs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from allocator.agent.planning.across_hosts import Share, share_of
from allocator.agent.planning.affinity import with_affinity
from allocator.agent.planning.desired_inputs import DEFAULT_MASTER_ADDR, DesiredInputs
from allocator.agent.planning.exclusive_claims import refuse_double_claims
from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.outcomes import not_running
from allocator.agent.planning.types import DesiredJob
from allocator.agent.planning.worker_specs import Rendezvous, running
from allocator.placement.choose import unavailable_gpus
from allocator.placement.ports import declared_master_port
from allocator.policy.model import FallbackRule, Job, Policy
from allocator.records.codec import replace_struct
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["desired_job", "desired_jobs", "held_by_process"]


def desired_jobs(inputs: DesiredInputs) -> dict[str, DesiredJob]:
    """Return the desired job for every assignment on the inputs' host, keyed by job name.

    A job ``failed`` at its assignment's revision stays failed until that
    revision changes. Assignments naming another host are not this agent's
    and are left out. See :class:`DesiredInputs` for what each input means.
    """
    pins, host, inventory = inputs.pinned, inputs.host, inputs.inventory
    if not inputs.host_named:
        return _host_not_in_policy(inputs)
    result = {
        name: held_by_process(assignment, inputs.assignment_revisions.get(name, 0))
        if assignment.run is not None
        else desired_job(
            inputs.policy,
            assignment,
            inputs.assignment_revisions.get(name, 0),
            inventory,
            {**inputs.unhealthy, **pins[name].unhealthy} if name in pins else inputs.unhealthy,
            inputs.failed.get(name),
            inputs.now,
            master_port=inputs.ports.get(name),
            master_addr=inputs.master_addr,
            share=share_of(assignment, inputs.address or inputs.master_addr, inputs.peers),
            mps_dir=inputs.mps_dir,
            vendor=inputs.vendor,
        )
        for name, assignment in sorted(inputs.assignments.items())
        if assignment.host == host
    }
    for name, pin in pins.items():
        if name in result and result[name].state in ("run", "wait"):
            result[name] = replace(result[name], message=f"{result[name].message}; {pin.note}")
    pool = inputs.policy.pool_of(host)
    if pool is None or not pool.sharing.shared:
        result = refuse_double_claims(
            result, inputs.holders, pool.name if pool else None, fingerprint(())
        )
    return with_affinity(result, inputs.policy, inventory, inputs.allowed_cpus)


def _host_not_in_policy(inputs: DesiredInputs) -> dict[str, DesiredJob]:
    """Every job of a host the applied policy no longer names: stopped, and why.

    Each stops with its own grace, as for any job the policy takes away;
    a holding of ``allocator run`` is its process's to end, as ever.
    """
    host, policy = inputs.host, inputs.policy
    message = (
        f"host '{host}' is not in the applied policy, so none of its jobs run here; "
        "`allocator release` frees its assignments"
    )
    result = {}
    for name, assignment in sorted(inputs.assignments.items()):
        revision = inputs.assignment_revisions.get(name, 0)
        if assignment.host != host:
            continue
        if assignment.run is not None:
            result[name] = held_by_process(assignment, revision)
            continue
        job = policy.jobs.get(name) or Job(name=name, command=())
        result[name] = not_running(job, assignment, revision, "refused", message)
    return result


def held_by_process(assignment: Assignment, revision: int) -> DesiredJob:
    """A job ``allocator run`` (or ``lease()``) holds: its GPUs are held, its process is not ours.

    The agent never starts or stops it; the holding process runs it and
    releases it (or its lease expires).
    """
    from allocator.records.holding import submitted_words

    holder = assignment.run
    pid = f" (pid {holder.pid})" if holder is not None else ""
    message = (
        submitted_words(assignment)
        if holder is not None and holder.launched_by == "submit"
        else f"held by `allocator {holder.launched_by if holder else 'run'}`{pid}; "
        "not run by the agent"
    )
    return not_running(
        Job(name=assignment.job, command=()), assignment, revision, "undeclared", message
    )


def desired_job(
    policy: Policy,
    assignment: Assignment,
    revision: int,
    inventory: Sequence[GpuInfo] | None,
    unhealthy: Mapping[int, str],
    failed_at: int | None,
    now: datetime | None = None,
    *,
    master_port: int | None = None,
    master_addr: str = DEFAULT_MASTER_ADDR,
    share: Share | None = None,
    mps_dir: str | None = None,
    vendor: str | None = None,
) -> DesiredJob:
    """Decide what one assigned job should do: run (and how), wait, fail or be refused.

    ``master_port`` is the port the agent allocated for a per-gpu job; a port
    the policy declares for the job wins over it. ``share`` is this host's
    place in a job across several hosts (``None`` for a job on one host).
    ``mps_dir`` and ``vendor``: see :class:`DesiredInputs`.
    """
    job = policy.jobs.get(assignment.job)
    if job is None:
        message = (
            f"job {assignment.job!r} holds GPUs but is not declared in the policy; "
            "the agent runs only declared jobs"
        )
        return not_running(
            Job(name=assignment.job, command=()), assignment, revision, "undeclared", message
        )
    argv, refusal = _command(job, assignment)
    if refusal is not None:
        return not_running(job, assignment, revision, "refused", refusal)
    if failed_at is not None and failed_at == revision:
        message = (
            f"job {job.name!r} was marked failed; it stays failed until its assignment changes"
        )
        return not_running(job, assignment, revision, "failed", message)
    if share is not None and share.failed:
        message = f"{share.failed}, so this share fails too (a collective needs every rank)"
        return not_running(job, assignment, revision, "failed", message)
    rank = Rendezvous(master_addr, _port_for(job, master_port), share, mps_dir, vendor)
    if assignment.mode == "cpu":
        reason = assignment.fallback_reason or "assigned gpus=cpu"
        on_cpu = _on_cpu(assignment, reason)
        return running(policy, job, on_cpu, argv, revision, inventory, "", rank)
    return _with_health(policy, job, assignment, argv, revision, inventory, unhealthy, now, rank)


def _port_for(job: Job, allocated: int | None) -> int | None:
    declared = declared_master_port(job)
    return declared if declared is not None else allocated


def _with_health(
    policy: Policy,
    job: Job,
    assignment: Assignment,
    argv: tuple[str, ...],
    revision: int,
    inventory: Sequence[GpuInfo] | None,
    unhealthy: Mapping[int, str],
    now: datetime | None,
    rank: Rendezvous,
) -> DesiredJob:
    """Apply the job's fallback rule when one of its GPUs is unhealthy or reserved for others.

    A share of a job across hosts applies it too when another share's GPUs
    are the trouble; only a fault of its own is published as its ``fault``.
    """
    bad, reserved = unavailable_gpus(policy, assignment, unhealthy, now)
    trouble = "; ".join(f"GPU {gpu} {why}" for gpu, why in bad.items())
    rule = policy.fallback_for(job.name)
    if bad and rule is None and not reserved:
        note = f"{trouble} (job {job.name!r} has no fallback rule; it keeps running on its GPUs)"
        return running(policy, job, assignment, argv, revision, inventory, note, rank)
    fault: str | None = trouble if bad else None
    if not bad and rank.share is not None and rank.share.trouble:
        # A share with no rule publishes a fault only when a reservation stops it.
        trouble = f"{rank.share.trouble} (this share follows: a collective needs every rank)"
    elif not bad:
        return running(policy, job, assignment, argv, revision, inventory, "", rank)
    if rule is None:  # running on would break the reservation
        message = f"{trouble}; job {job.name!r} has no fallback rule, so it waits"
        return not_running(job, assignment, revision, "wait", message, fault)
    if rule.action == "cpu":
        note = f"{trouble}; running on CPU ({_rule_words(rule)})"
        on_cpu = _on_cpu(assignment, trouble)
        return running(policy, job, on_cpu, argv, revision, inventory, note, rank, fault)
    if rule.action == "wait":
        message = f"{trouble}; waiting for it to recover ({_rule_words(rule)})"
        return not_running(job, assignment, revision, "wait", message, fault)
    message = f"{trouble}; job {job.name!r} failed ({_rule_words(rule)})"
    return not_running(job, assignment, revision, "failed", message, fault)


def _rule_words(rule: FallbackRule) -> str:
    return f"fallback rule {rule.name!r}: {rule.action}"


def _on_cpu(assignment: Assignment, reason: str) -> Assignment:
    """The same assignment moved to CPU, so the rendered environment hides every GPU."""
    return replace_struct(assignment, mode="cpu", gpus=(), fallback_reason=reason)


def _command(job: Job, assignment: Assignment) -> tuple[tuple[str, ...], str | None]:
    """The argv to run and, when the assignment's ad-hoc command is not allowed, why."""
    if assignment.command is None:
        return job.command, None
    if not job.allow_adhoc_command:
        return (), (
            f"job {job.name!r}: the assignment carries its own command but the policy does "
            "not allow ad-hoc commands for this job (allow_adhoc_command: false)"
        )
    if not assignment.command:
        return (), f"job {job.name!r}: the assignment's ad-hoc command is empty"
    return assignment.command, None
