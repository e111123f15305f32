"""MASTER_PORT for each multi-worker job on a host: unique, stable, and free (pure).

torchrun-style ranks of a ``workers: per-gpu`` job meet at
``MASTER_ADDR:MASTER_PORT``; two jobs on one host given the same port would
join each other's rendezvous. Rules:

* A port the job's ``env`` declares in the policy wins (two jobs declaring
  the same one is a policy problem: :func:`shared_declared_ports` names them).
* Otherwise each job gets a port from :data:`MASTER_PORT_RANGE`, starting at
  its preferred one (derived from its name, so usually the same on every
  host and run) and moving up past ports another job holds, a job declares,
  or something on the host is already listening on (checked with a bind).
* A job keeps its port for as long as it is assigned to the host, across
  restarts of the agent (:mod:`allocator.agent.planning.port_table` saves the table):
  a changed port changes the workers' environment, which restarts them.
* A job across several hosts has one port for the whole job, chosen when it
  was set (:mod:`allocator.control.across_hosts`) and stored in its assignment: it takes no
  port from this table, and on its first host (where its rank 0 listens) its
  port is reserved like a declared one.

:func:`allocate_master_ports` is pure; ``allocator env`` calls it with the
ports the agent published, so it shows what the agent gives.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from allocator.placement.worker_env import MASTER_PORT_RANGE, default_master_port
from allocator.policy.model import Job, Policy
from allocator.records.types import Assignment

__all__ = [
    "MASTER_PORT_RANGE",
    "allocate_master_ports",
    "declared_master_port",
    "first_free_port",
    "shared_declared_ports",
]


def declared_master_port(job: Job) -> int | None:
    """The MASTER_PORT the policy sets in the job's env, if it is a valid port."""
    declared = job.env.get("MASTER_PORT", "")
    if declared.isascii() and declared.isdigit() and 0 < int(declared) < 65536:
        return int(declared)
    return None


def _needs_port(job: Job | None, assignment: Assignment) -> bool:
    return (
        job is not None
        and job.workers in ("per-gpu", "torchrun")
        and declared_master_port(job) is None
        and not assignment.nodes  # a job across hosts brings its own
    )


def _group_ports(host: str, assignments: Mapping[str, Assignment]) -> set[int]:
    """Ports of jobs across hosts whose rank 0 listens on ``host``."""
    return {
        a.master_port
        for a in assignments.values()
        if a.host == host and a.nodes[:1] == (host,) and a.master_port is not None
    }


def _on_host(policy: Policy, host: str, assignments: Mapping[str, Assignment]) -> list[Job]:
    jobs = [policy.jobs.get(name) for name, a in sorted(assignments.items()) if a.host == host]
    return [job for job in jobs if job is not None]


def allocate_master_ports(
    policy: Policy,
    host: str,
    assignments: Mapping[str, Assignment],
    held: Mapping[str, int],
    *,
    is_free: Callable[[int], bool] = lambda port: True,
    running: Collection[str] = (),
) -> dict[str, int]:
    """Port per per-gpu job assigned on ``host`` that declares none (pure but for ``is_free``).

    ``held`` are the ports jobs already have: each keeps its own unless another
    job already kept it or the policy now declares it. ``running`` jobs (with
    live workers) take their port without a bind check: their rank 0 listens on it.
    A job for which the range has no free port is left out.
    """
    on_host = _on_host(policy, host, assignments)
    reserved = {p for job in on_host if (p := declared_master_port(job)) is not None}
    reserved |= _group_ports(host, assignments)
    needing = sorted(job.name for job in on_host if _needs_port(job, assignments[job.name]))
    ports: dict[str, int] = {}
    taken = set(reserved)
    for name in needing:
        port = held.get(name)
        if port is not None and port not in taken and _in_range(port):
            ports[name] = port
            taken.add(port)
    for name in needing:
        if name in ports:
            continue
        check = (lambda port: True) if name in running else is_free
        port = first_free_port(default_master_port(name), taken, check)
        if port is not None:
            ports[name] = port
            taken.add(port)
    return ports


def _in_range(port: int) -> bool:
    low, high = MASTER_PORT_RANGE
    return low <= port < high


def first_free_port(
    start: int, taken: Collection[int], is_free: Callable[[int], bool] = lambda port: True
) -> int | None:
    """The first port of :data:`MASTER_PORT_RANGE` from ``start`` (wrapping) not taken and free."""
    low, high = MASTER_PORT_RANGE
    for step in range(high - low):
        port = low + (start - low + step) % (high - low)
        if port not in taken and is_free(port):
            return port
    return None


def shared_declared_ports(
    policy: Policy, host: str, assignments: Mapping[str, Assignment]
) -> dict[int, list[str]]:
    """Ports that two or more jobs assigned on ``host`` declare (port -> job names)."""
    by_port: dict[int, list[str]] = {}
    for job in _on_host(policy, host, assignments):
        port = declared_master_port(job)
        if port is not None:
            by_port.setdefault(port, []).append(job.name)
    return {port: names for port, names in sorted(by_port.items()) if len(names) > 1}
