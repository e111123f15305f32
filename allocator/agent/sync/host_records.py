"""What the agent reads from the store, decoded (pure: no I/O).

One prefix read of ``hosts/<host>/`` plus the policy key becomes a
:class:`HostView`: the well-formed assignments, the policy record, every
record that could not be used (with why), and the agent's own keys as they
are stored (its liveness record and ``workers/``), which the publisher
compares with what it means to publish.

A key the agent cannot handle is a bad record like any other: a job key
whose name is not a valid job name (``jobs/bad name``, ``jobs/a/b``,
``jobs/train\\n``) is skipped and reported, never raised, so it cannot be
mistaken for a store outage or for another job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.sync.policy_read import PolicyRead, SharedPolicy
from allocator.errors import BadRecord, InvalidName
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout, validate_name
from allocator.records.types import Assignment, PolicyRecord
from allocator.store import KeyValue, Listing

__all__ = ["HostView", "host_view", "own_keys"]


@dataclass(frozen=True, slots=True)
class HostView:
    """This host's state as one read saw it.

    ``policy`` is ``None`` when no usable policy is stored (absent, or a bad
    record: see ``bad``); the agent then keeps the last good one it had. It
    is the whole policy record, or the host's share of the policy.
    ``bad`` pairs each skipped record with its ``mod_revision``, so it is
    reported once per version; ``damaged`` names the jobs whose own key holds
    such a record (the agent keeps their last good assignment: a damaged
    record is never a reason to stop a worker). ``own`` maps each of the
    agent's own keys to what is stored there. ``peers`` are the other hosts
    of this host's jobs across hosts, read right after.
    """

    revision: int
    assignments: Mapping[str, Assignment] = field(default_factory=dict)
    revisions: Mapping[str, int] = field(default_factory=dict)
    policy: PolicyRecord | SharedPolicy | None = None
    policy_present: bool = False
    bad: tuple[tuple[BadRecord, int], ...] = ()
    damaged: frozenset[str] = frozenset()
    own: Mapping[str, KeyValue] = field(default_factory=dict)
    peers: Mapping[str, PeerHost] = field(default_factory=dict)


def host_view(
    listing: Listing,
    policy_item: KeyValue | None,
    layout: KeyLayout,
    host: str,
    *,
    read: PolicyRead | None = None,
) -> HostView:
    """Decode a read of ``layout.host(host)`` and of the policy key.

    ``read``: the policy as :class:`~allocator.agent.sync.policy_read.PolicyReader`
    read it (its share, or the whole record), instead of ``policy_item``.
    """
    jobs_prefix = layout.host_jobs(host)
    assignments: dict[str, Assignment] = {}
    revisions: dict[str, int] = {}
    bad: list[tuple[BadRecord, int]] = []
    damaged: set[str] = set()
    own = {item.key: item for item in listing.items if _is_own(item.key, layout, host)}
    for item in listing.items:
        if not item.key.startswith(jobs_prefix):
            continue
        job = ""
        try:
            job = _job_name(item.key, item.key[len(jobs_prefix) :])
            assignments[job] = decode_record(item.value, Assignment, item.key, job=job, host=host)
            revisions[job] = item.mod_revision
        except BadRecord as exc:
            bad.append((exc, item.mod_revision))
            if job:
                damaged.add(job)
    policy: PolicyRecord | SharedPolicy | None = None
    if read is not None:
        policy = read.policy
        bad += read.bad
    elif policy_item is not None:
        try:
            policy = decode_record(policy_item.value, PolicyRecord, policy_item.key)
        except BadRecord as exc:
            bad.append((exc, policy_item.mod_revision))
    return HostView(
        revision=listing.revision,
        assignments=assignments,
        revisions=revisions,
        policy=policy,
        policy_present=read.present if read is not None else policy_item is not None,
        bad=tuple(bad),
        damaged=frozenset(damaged),
        own=own,
    )


def own_keys(layout: KeyLayout, host: str) -> tuple[str, str]:
    """The agent's liveness key and the prefix of its worker records."""
    return layout.agent(host), layout.host_workers(host)


def _is_own(key: str, layout: KeyLayout, host: str) -> bool:
    agent, workers = own_keys(layout, host)
    return key == agent or key.startswith(workers)


def _job_name(key: str, name: str) -> str:
    """The job a key under ``jobs/`` names, or BadRecord when it names none."""
    try:
        return validate_name(name, "job name")
    except InvalidName as exc:
        raise BadRecord(key, f"the key does not end in a valid job name: {exc}") from None
