"""What the store holds, decoded: the applied policy and each host's keys.

:class:`HostSnapshot` is everything under one host, decoded from one prefix
read; :func:`snapshots_by_host` decodes a read of many hosts in one pass. A
record that does not decode is left out and reported, never a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from allocator.errors import BadRecord, NotFound, RequestError
from allocator.records.codec import current_record, decode_record
from allocator.records.keys import KeyLayout, split_host_key
from allocator.records.types import AgentRecord, Assignment, PolicyRecord, WorkerRecord
from allocator.store import KeyValue, Store, bad_key_records

if TYPE_CHECKING:  # the policy loader costs import time a reader of hosts need not pay
    from allocator.policy import Policy

__all__ = [
    "HostSnapshot",
    "PolicySnapshot",
    "job_not_found",
    "no_policy_error",
    "read_host",
    "snapshots_by_host",
]


@dataclass(frozen=True, slots=True)
class PolicySnapshot:
    """The applied policy, its record, and the revision it was read at.

    ``host``: the policy holds only that host's share of it (see
    :mod:`allocator.policy.shares`), enough to decide a change there; ``None``:
    the whole policy.
    """

    policy: Policy
    record: PolicyRecord
    revision: int
    host: str | None = None


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """Everything stored under one host, read in one prefix read.

    ``generation`` and ``agent_revision`` are the mod revisions of the host's
    generation key and agent record (0: absent): a write checked against
    this snapshot compares them.
    """

    host: str
    assignments: dict[str, Assignment] = field(default_factory=dict)
    generation: int = 0
    agent: AgentRecord | None = None
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    revision: int = 0
    bad_records: tuple[BadRecord, ...] = ()
    agent_revision: int = 0


def snapshots_by_host(
    items: Sequence[KeyValue], layout: KeyLayout, revision: int
) -> dict[str, HostSnapshot]:
    """Decode keys read under the hosts prefix into one :class:`HostSnapshot` per host.

    One pass over ``items``: ``status`` on a fleet reads every host at once
    (14,000 keys at 1,000 hosts), so the common case (a record as this
    allocator writes it, naming its own key) is decoded in one call and
    anything else sent through
    :func:`~allocator.records.codec.decode_record`, which says what is wrong.
    A record that does not decode, or whose body disagrees with its key, is
    left out and listed in its host's ``bad_records``; it never hides the
    rest of the host, let alone other hosts.
    """
    parts: dict[str, _Parts] = {}
    hosts = layout.hosts
    for item in items:
        parsed = split_host_key(item.key, hosts)  # <host>/<kind>[/<job>]
        if parsed is None:
            continue
        host, kind, name = parsed
        part = parts.get(host)
        if part is None:
            part = parts[host] = _Parts()
        try:
            part.add(item, host, kind, name)
        except BadRecord as exc:
            part.bad.append(exc)
    return {host: part.snapshot(host, revision) for host, part in parts.items()}


class _Parts:
    """One host's records while :func:`snapshots_by_host` collects them."""

    __slots__ = ("agent", "agent_revision", "assignments", "bad", "generation", "workers")

    def __init__(self) -> None:
        self.assignments: dict[str, Assignment] = {}
        self.workers: dict[str, WorkerRecord] = {}
        self.generation = 0
        self.agent: AgentRecord | None = None
        self.agent_revision = 0
        self.bad: list[BadRecord] = []

    def add(self, item: KeyValue, host: str, kind: str, name: str) -> None:
        """File one key of the host; :class:`BadRecord` for a record that cannot be filed."""
        if kind == "jobs" and name:
            self.assignments[name] = _named(item, Assignment, host, name)
        elif kind == "workers" and name:
            self.workers[name] = _named(item, WorkerRecord, host, name)
        elif kind == "generation":
            self.generation = item.mod_revision
        elif kind == "agent":
            self.agent_revision = item.mod_revision  # compared even when the body is damaged
            self.agent = decode_record(item.value, AgentRecord, item.key, host=host)

    def snapshot(self, host: str, revision: int) -> HostSnapshot:
        """What was filed, as the host's snapshot read at ``revision``."""
        return HostSnapshot(
            host,
            self.assignments,
            self.generation,
            self.agent,
            self.workers,
            revision,
            tuple(self.bad),
            self.agent_revision,
        )


_Named = TypeVar("_Named", Assignment, WorkerRecord)


def _named(item: KeyValue, kind: type[_Named], host: str, job: str) -> _Named:
    """``item``'s record of ``job`` on ``host``; :class:`BadRecord` if it is not one.

    The common case (written as this allocator writes it, naming its own
    key) takes one call; anything else goes through the checked path, which
    says what is wrong.
    """
    record = current_record(item.value, kind)
    if record is None or record.job != job or record.host != host:
        record = decode_record(item.value, kind, item.key, job=job, host=host)
    return record


def read_host(
    store: Store, layout: KeyLayout, host: str, on_bad: Callable[[BadRecord], None]
) -> HostSnapshot:
    """Everything stored under ``host``, in one prefix read; bad records reported."""
    listing = store.list(layout.host(host))
    found = snapshots_by_host(listing.items, layout, listing.revision)
    snapshot = found.get(host, HostSnapshot(host, revision=listing.revision))
    for bad in (*bad_key_records(listing), *snapshot.bad_records):
        on_bad(bad)
    return snapshot


def no_policy_error(url: str) -> RequestError:
    """What a write that needs a policy raises in the store at ``url``, which has none."""
    return RequestError(f"no policy applied in {url}: run `allocator policy apply FILE` first")


def job_not_found(job: str, host: str | None, held_there: Sequence[str] = ()) -> NotFound:
    """The one "not found" answer of every command that looks a job up (exit 6).

    ``host`` ``None`` means every host was searched; ``held_there`` names
    the jobs that host does hold, to catch a typo.
    """
    where = f"on host {host!r}" if host else "on any host"
    others = f" (jobs there: {', '.join(sorted(held_there))})" if held_there else ""
    return NotFound(f"job {job!r} holds nothing {where}{others}")
