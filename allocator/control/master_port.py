"""The one ``MASTER_PORT`` of a job across hosts, chosen at set time on its first host's behalf.

A port the job's ``env`` declares wins; else the job keeps the port it has
while its first host stays the same; else the first port from the job's
derived one that no job on the first host declares, is given by its agent,
or holds as another multi-host job's rank 0. The first host's agent keeps
its own jobs off that port (:mod:`allocator.agent.planning.port_table`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocator.errors import PlacementRefused

if TYPE_CHECKING:
    from allocator.policy import Policy
    from allocator.records.types import Assignment
    from allocator.status.snapshots import HostSnapshot

__all__ = ["choose_master_port"]


def choose_master_port(
    policy: Policy, job: str, first: HostSnapshot, current: Assignment | None
) -> int:
    """The job's one MASTER_PORT, on its first host's behalf (see the module docstring)."""
    from allocator.placement.ports import declared_master_port, first_free_port
    from allocator.placement.worker_env import default_master_port

    spec = policy.jobs.get(job)
    declared = declared_master_port(spec) if spec is not None else None
    if declared is not None:
        return declared
    if current is not None and current.nodes[:1] == (first.host,) and current.master_port:
        return current.master_port
    port = first_free_port(default_master_port(job), _ports_in_use(policy, first, job))
    if port is None:
        raise PlacementRefused(f"no MASTER_PORT is free on {first.host} for job {job!r}")
    return port


def _ports_in_use(policy: Policy, first: HostSnapshot, job: str) -> set[int]:
    """Ports on the first host that jobs other than ``job`` declare, were given, or hold."""
    from allocator.placement.ports import declared_master_port

    taken: set[int] = set()
    for name, held in first.assignments.items():
        spec = policy.jobs.get(name)
        declared = declared_master_port(spec) if spec is not None else None
        if name == job:
            continue
        if declared is not None:
            taken.add(declared)
        if held.nodes[:1] == (first.host,) and held.master_port:
            taken.add(held.master_port)
    taken |= {w.master_port for n, w in first.workers.items() if n != job and w.master_port}
    return taken
