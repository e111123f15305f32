"""A share of a job across several hosts: what the agent needs from the other hosts (pure).

Each share's assignment names the job's nodes (node rank = position) and its
MASTER_PORT, so an agent learns its place from its own host's keys. From the
other hosts it needs two things, which its store link reads (one prefix read
per such host, and a watch on it) and hands over as :class:`PeerHost` values:

* ``MASTER_ADDR``: the address the first host's agent advertises in its
  record (its ``master_addr`` setting, else its host name); while that agent
  is not up, the one its share's workers were last given (their worker
  record). Unknown until then: the share waits, since its ranks would have
  nowhere to meet.
* the other shares' state, for "failure rules apply to the whole job": each
  agent publishes, in the share's worker record, the ``fault`` of its own
  GPUs when the job's fallback rule is at work because of them. Every other
  share then applies the same rule (``wait`` stops every share, ``cpu``
  moves every share to the CPU, ``fail`` fails every share), because a
  collective cannot run with a missing rank. A share follows only faults of
  its own cause, never another's following, so a recovered GPU releases the
  whole job; and only records about the same assignment (the worker record's
  revision is that host's assignment's), so no share acts on a stale report.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from allocator.errors import BadRecord
from allocator.placement.worker_env import NodeGroup
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.store import KeyValue

__all__ = [
    "PeerHost",
    "PeerShare",
    "Share",
    "master_address",
    "peer_from_listing",
    "peer_jobs",
    "share_of",
]


@dataclass(frozen=True, slots=True)
class PeerShare:
    """Another host's share of one job as last read: its assignment and its worker record."""

    assignment: Assignment | None
    revision: int
    worker: WorkerRecord | None

    def reports_on(self, mine: Assignment) -> WorkerRecord | None:
        """Its worker record, if it reports on the same job across the same hosts, as it is now."""
        held, worker = self.assignment, self.worker
        if held is None or worker is None or worker.assignment_revision != self.revision:
            return None
        if (held.nodes, held.master_port) != (mine.nodes, mine.master_port):
            return None
        return worker


@dataclass(frozen=True, slots=True)
class PeerHost:
    """What the agent read of another host that shares one of its jobs.

    ``readable`` is false when the store refused the read (an agent allowed to
    read only its own host's keys): nothing else is known then.
    """

    host: str
    readable: bool = True
    agent_alive: bool = False
    address: str | None = None
    shares: Mapping[str, PeerShare] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Share:
    """This host's share of a job across hosts, as the other hosts' state decides it.

    ``group`` is ``None`` while MASTER_ADDR is unknown (``waiting_for`` says
    why); ``trouble`` is another share's fault (the job's fallback applies
    here too); ``failed`` says another share failed.
    """

    group: NodeGroup | None
    waiting_for: str = ""
    trouble: str | None = None
    failed: str | None = None


def peer_jobs(assignments: Mapping[str, Assignment], host: str) -> dict[str, tuple[str, ...]]:
    """Each other host of ``host``'s jobs across hosts -> the jobs it shares with ``host``."""
    found: dict[str, set[str]] = {}
    for job, assignment in assignments.items():
        if assignment.host != host:
            continue
        for node in assignment.nodes:
            if node != host:
                found.setdefault(node, set()).add(job)
    return {node: tuple(sorted(jobs)) for node, jobs in sorted(found.items())}


def peer_from_listing(
    items: Sequence[KeyValue], layout: KeyLayout, host: str, jobs: Collection[str]
) -> tuple[PeerHost, list[tuple[BadRecord, int]]]:
    """Decode one prefix read of ``host``: its agent, and its shares of ``jobs``.

    A record that does not decode is returned with its revision (to be
    reported once) and counts as absent.
    """
    bad: list[tuple[BadRecord, int]] = []
    by_key = {item.key: item for item in items}
    alive, address = False, None
    agent = by_key.get(layout.agent(host))
    if agent is not None:
        alive = agent.lease is not None
        try:
            address = decode_record(agent.value, AgentRecord, agent.key, host=host).address
        except BadRecord as exc:
            bad.append((exc, agent.mod_revision))
    shares = {}
    for job in sorted(jobs):
        held = _decoded(by_key.get(layout.assignment(host, job)), Assignment, job, host, bad)
        worker = _decoded(by_key.get(layout.workers(host, job)), WorkerRecord, job, host, bad)
        item = by_key.get(layout.assignment(host, job))
        shares[job] = PeerShare(held, item.mod_revision if item else 0, worker)
    return PeerHost(host, True, alive, address, shares), bad


R = TypeVar("R", Assignment, WorkerRecord)


def _decoded(
    item: KeyValue | None, kind: type[R], job: str, host: str, bad: list[tuple[BadRecord, int]]
) -> R | None:
    if item is None:
        return None
    try:
        return decode_record(item.value, kind, item.key, job=job, host=host)
    except BadRecord as exc:
        bad.append((exc, item.mod_revision))
        return None


def master_address(
    assignment: Assignment, own_address: str | None, peers: Mapping[str, PeerHost]
) -> str | None:
    """MASTER_ADDR of a job across hosts: its first host's advertised address.

    ``own_address`` is the address this host advertises (``None``: unknown).
    """
    first = assignment.nodes[0]
    if first == assignment.host:
        return own_address
    peer = peers.get(first)
    if peer is None:
        return None
    if peer.address:
        return peer.address
    share = peer.shares.get(assignment.job)
    worker = share.reports_on(assignment) if share is not None else None
    return worker.master_addr if worker is not None else None


def share_of(
    assignment: Assignment, own_address: str | None, peers: Mapping[str, PeerHost]
) -> Share | None:
    """This host's share of ``assignment``'s job (``None`` for a job on one host)."""
    if not assignment.nodes or assignment.master_port is None:
        return None
    trouble = failed = None
    for node in assignment.nodes:
        peer = peers.get(node)
        share = peer.shares.get(assignment.job) if peer is not None else None
        worker = share.reports_on(assignment) if share is not None else None
        if node == assignment.host or worker is None:
            continue
        if worker.state == "failed" and failed is None:
            failed = f"the job's share on {node} failed"
        if worker.fault and trouble is None:
            trouble = f"{node}: {worker.fault}"
    addr = master_address(assignment, own_address, peers)
    if addr is None:
        first = assignment.nodes[0]
        why = (
            f"waiting for the address of {first}, where rank 0 runs "
            f"(its agent has not published one{_unreadable(peers.get(first))})"
        )
        return Share(None, why, trouble, failed)
    group = NodeGroup(assignment.node_rank, len(assignment.nodes), addr, assignment.master_port)
    return Share(group, "", trouble, failed)


def _unreadable(peer: PeerHost | None) -> str:
    if peer is not None and not peer.readable:
        return "; this agent may not read that host's keys"
    return ""
