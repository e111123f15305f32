"""The environments a held job's workers start with, as its agent would set them.

``allocator env`` prints them, ``allocator run`` and :func:`allocator.lease`
set them: a library module, so the public ``lease()`` imports no CLI. See
``allocator env --help`` for what they hold.
"""

from __future__ import annotations

from typing import Any

__all__ = ["job_environments", "worker_envs"]


def worker_envs(
    allocator: Any, job: str, host: str | None, *, per_gpu: bool = False
) -> tuple[list[dict[str, str]], str]:
    """The job's worker environments, and a remark (why none, or a fallback).

    The agent's own function decides them; ``allocator env``, ``allocator run``
    and ``allocator.lease()`` call this. ``per_gpu``: a job the policy does
    not declare runs one worker per GPU.
    """
    envs, remark, _ = job_environments(allocator, job, host, per_gpu=per_gpu)
    return envs, remark


def job_environments(
    allocator: Any, job: str, host: str | None, *, per_gpu: bool = False
) -> tuple[list[dict[str, str]], str, list[str]]:
    """The job's worker environments, a remark (why none, or a fallback), container commands."""
    from allocator.errors import RequestError
    from allocator.records.keys import validate_name
    from allocator.status.snapshots import job_not_found

    snapshot = allocator.require_policy()
    policy = snapshot.policy
    if host is None:
        found = allocator.find_job(job)
        hosts = sorted({a.host for a in found})
        if len(hosts) > 1:
            raise RequestError(
                f"job {job!r} holds GPUs on {', '.join(hosts)}: say which with host="
            )
        if not hosts:
            raise job_not_found(job, None)
        host = hosts[0]
    state = allocator.host(validate_name(host, "host"))
    assignment = state.assignments.get(job)
    if assignment is None:
        raise job_not_found(job, host, list(state.assignments))
    inventory, unhealthy, vendor = _inventory(state, policy, host)
    share = _share(allocator, assignment) if assignment.nodes else None
    if job not in policy.jobs:  # no agent runs it: whoever does gets the same rendezvous
        envs, remark = _undeclared_environments(
            assignment, inventory, policy, share, vendor, per_gpu
        )
        return envs, remark, [""] * len(envs)
    # Only now: the agent's planner (every vendor's visibility rules) is most of what
    # ``run`` would import, and a job no policy declares (``run``'s own) never needs it.
    from allocator.agent.planning.desired import desired_job

    addr, port = _rendezvous(state, policy, host, job)
    want = desired_job(
        policy,
        assignment,
        0,
        inventory,
        unhealthy,
        None,
        allocator.clock(),  # inside a reservation window the agent moves the job too
        master_port=port,
        master_addr=addr,
        share=share,
        vendor=vendor,
    )
    envs = [dict(w.env) for w in want.workers]
    written = assignment.command or policy.jobs[job].command
    return envs, want.message or (want.fallback_reason or ""), _commands(want.workers, written)


def _commands(workers: Any, written: tuple[str, ...]) -> list[str]:
    """Each worker's command as its agent builds it, as a comment line: its container's
    engine command line, or the command when it is not the one ``written`` (torchrun in
    front, ``$(VAR)`` expanded); "" for a host process that runs ``written`` as it is."""
    import shlex

    from allocator.agent.planning.containers import container_argv, container_name

    commands = []
    for w in workers:
        if w.container is not None:
            name = container_name(f"{w.job}.{w.index}.LAUNCH")
            argv = container_argv(
                w.container, name=name, env_names=tuple(w.env), argv=w.argv, cwd=w.cwd
            )
            commands.append(f"# container: {shlex.join(argv)}")
        elif tuple(w.argv) != tuple(written):
            commands.append(f"# command: {shlex.join(w.argv)}")
        else:
            commands.append("")
    return commands


def _undeclared_environments(
    assignment: Any,
    inventory: Any,
    policy: Any,
    share: Any,
    vendor: str | None,
    per_gpu: bool = False,
) -> tuple[list[dict[str, str]], str]:
    """Environments of a job the policy does not declare: its share's rendezvous included.

    MASTER_ADDR is the first host's advertised address; until its agent has
    published one, the first host's name (what the policy calls it) stands in.
    """
    from allocator.placement.worker_env import NodeGroup, worker_environments

    if share is None:
        envs = worker_environments(assignment, inventory, policy, vendor=vendor, per_gpu=per_gpu)
        return envs, ""
    group, remark = share.group, ""
    if group is None:
        first = assignment.nodes[0]
        group = NodeGroup(
            assignment.node_rank, len(assignment.nodes), first, assignment.master_port
        )
        remark = f"MASTER_ADDR is the host name {first!r}: its agent has published no address"
    return worker_environments(assignment, inventory, policy, group=group, vendor=vendor), remark


def _rendezvous(state: Any, policy: Any, host: str, job: str) -> tuple[str, int | None]:
    """MASTER_ADDR and MASTER_PORT as the host's agent gives them to ``job``."""
    from allocator.agent.planning.desired_inputs import DEFAULT_MASTER_ADDR
    from allocator.placement.ports import allocate_master_ports

    published = state.workers.get(job)
    if published is not None and published.master_port is not None:
        return published.master_addr or DEFAULT_MASTER_ADDR, published.master_port
    held = {name: r.master_port for name, r in state.workers.items() if r.master_port is not None}
    addrs = {r.master_addr for r in state.workers.values() if r.master_addr}
    addr = addrs.pop() if len(addrs) == 1 else DEFAULT_MASTER_ADDR
    return addr, allocate_master_ports(policy, host, state.assignments, held).get(job)


def _share(allocator: Any, assignment: Any) -> Any:
    """The share's place in its job across hosts, from one read of each of the job's hosts."""
    from allocator.agent.planning.across_hosts import peer_from_listing, share_of

    peers = {}
    for node in assignment.nodes:
        listing = allocator.store.list(allocator.layout.host(node))
        peers[node], _ = peer_from_listing(listing.items, allocator.layout, node, [assignment.job])
    own = peers.pop(assignment.host)
    mine = own.shares[assignment.job].worker
    address = own.address or (mine.master_addr if mine is not None else None)
    return share_of(assignment, address, peers)


def _inventory(state: Any, policy: Any, host: str) -> tuple[Any, dict[int, str], str | None]:
    """The host agent's inventory, health and GPU vendor, else this machine's (or the
    policy's declared count and vendor)."""
    import os

    from allocator.util.identity import local_hostname

    agent = state.agent
    if agent is not None and agent.gpus:
        return agent.gpus, dict(agent.unhealthy), agent.vendor or policy.vendor_of(host)
    if host == local_hostname() or os.environ.get("ALLOCATOR_NVML"):
        from allocator.gpus.vendors.registry import read_host_inventory

        declared = policy.hosts.get(host)
        here = read_host_inventory(
            declared.gpus if declared else None, environ=os.environ, vendor=policy.vendor_of(host)
        )
        return here.gpus or None, {}, here.vendor
    return None, {}, policy.vendor_of(host)
