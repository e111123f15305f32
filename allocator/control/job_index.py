"""The job index: ``/allocator/v1/jobs/<job>`` names the hosts where a job holds GPUs.

Every assignment change writes it in the same transaction as the assignment
(comparing its revision), so it can never disagree with the assignments the
CLI wrote, and finding a job reads this one key and then that job's own keys,
instead of every key of every host.

A store written before the index existed (or an index damaged by hand) has
no usable entry; then, and only then, finding a job falls back to the one
prefix read over all hosts that it always was. ``policy apply`` records in
the policy whether every job holding GPUs had its entry (it reads every
host then anyway): under such a policy a job without an entry holds
nothing, and a new job's first ``set`` reads no other host.

A job across several hosts (``set host=a,b``) has its nodes, in node-rank
order, and its MASTER_PORT in the index too. Such a job is changed only as a
whole (:mod:`allocator.control.across_hosts`): a change of one host's share alone is
refused here, before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from allocator.errors import BadRecord, RequestError
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, JobIndex
from allocator.store import Compare, Delete, KeyValue, Op, Put, Store

__all__ = [
    "IndexEntry",
    "JobLocation",
    "complete_index",
    "group_index_change",
    "holders",
    "index_change",
    "index_complete",
    "index_covers",
    "index_for_write",
    "index_of",
    "locate_job",
    "read_index",
]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The job's index as read: its hosts (None: no usable entry) and the key's revision.

    ``nodes`` and ``master_port`` are set for a job across several hosts.
    """

    job: str
    hosts: tuple[str, ...] | None
    revision: int
    nodes: tuple[str, ...] = ()
    master_port: int | None = None


@dataclass(frozen=True, slots=True)
class JobLocation:
    """Where a job was found: its assignments, and hosts whose record of it is damaged.

    ``nodes`` is set for a job across several hosts (in node-rank order).
    """

    assignments: list[Assignment]
    damaged: list[str]
    nodes: tuple[str, ...] = ()


def read_index(
    store: Store, layout: KeyLayout, job: str, on_bad: Callable[[BadRecord], None]
) -> IndexEntry:
    """Read ``job``'s index entry (a damaged one is reported and read as absent)."""
    return index_of(store.get(layout.job_index(job)), job, on_bad)


def index_of(item: KeyValue | None, job: str, on_bad: Callable[[BadRecord], None]) -> IndexEntry:
    """The entry a read of ``job``'s index key holds (pure; a damaged one reads as absent)."""
    if item is None:
        return IndexEntry(job, None, 0)
    try:
        index = decode_record(item.value, JobIndex, item.key, job=job)
    except BadRecord as exc:
        on_bad(exc)
        return IndexEntry(job, None, item.mod_revision)
    return IndexEntry(job, index.hosts, item.mod_revision, index.nodes, index.master_port)


def index_for_write(
    store: Store,
    layout: KeyLayout,
    job: str,
    on_bad: Callable[[BadRecord], None],
    *,
    indexed: bool = False,
) -> IndexEntry:
    """``job``'s index entry before a change; without a usable one, rebuilt from the hosts.

    A store written before the index existed (or an entry damaged by hand)
    would otherwise get an index naming only the host being changed.
    ``indexed``: as for :func:`complete_index`.
    """
    entry = read_index(store, layout, job, on_bad)
    return complete_index(store, layout, entry, on_bad, indexed=indexed)


def index_complete(
    host_items: Iterable[KeyValue], index_items: Iterable[KeyValue], layout: KeyLayout
) -> bool:
    """Whether every assignment under the hosts has an index entry naming its host (pure).

    ``host_items``: a read of every host's keys; ``index_items``: of every
    index entry, at the same moment. A damaged entry or assignment is not
    complete: finding its job then keeps searching every host.
    """
    return index_covers(holders(host_items, layout), index_items, layout)


def holders(host_items: Iterable[KeyValue], layout: KeyLayout) -> dict[str, set[str]]:
    """Job -> the hosts it has an assignment key on, in ``host_items`` (pure)."""
    held: dict[str, set[str]] = {}
    for item in host_items:
        parsed = layout.parse_host_key(item.key)
        if parsed is not None and parsed[1] == "jobs" and parsed[2]:
            held.setdefault(parsed[2], set()).add(parsed[0])
    return held


def index_covers(
    held: dict[str, set[str]], index_items: Iterable[KeyValue], layout: KeyLayout
) -> bool:
    """Whether the index entries name every host of ``held`` (see :func:`holders`) (pure)."""
    named: dict[str, frozenset[str]] = {}
    for item in index_items:
        job = item.key[len(layout.jobs) :]
        try:
            index = decode_record(item.value, JobIndex, item.key, job=job)
        except BadRecord:
            return False
        named[job] = frozenset(index.hosts)
    return all(hosts <= named.get(job, frozenset()) for job, hosts in held.items())


def complete_index(
    store: Store,
    layout: KeyLayout,
    entry: IndexEntry,
    on_bad: Callable[[BadRecord], None],
    *,
    indexed: bool = False,
) -> IndexEntry:
    """``entry`` if usable; else the job's hosts found by scanning every host (one read).

    ``indexed``: the applied policy says every job holding GPUs has an
    entry, so an absent one (not a damaged one) means the job holds nothing.
    Callers pass it only when the hosts they read hold nothing of the job
    (an entry missing next to an assignment was lost, and is rebuilt).
    """
    if entry.hosts is not None:
        return entry
    if indexed and entry.revision == 0:
        return IndexEntry(entry.job, (), 0)
    job = entry.job
    found = _scan(store.list(layout.hosts).items, layout, job, on_bad)
    hosts = {a.host for a in found.assignments} | set(found.damaged)
    group = next((a for a in found.assignments if a.nodes), None)
    if group is None:
        return IndexEntry(job, tuple(sorted(hosts)), entry.revision)
    return IndexEntry(job, tuple(sorted(hosts)), entry.revision, group.nodes, group.master_port)


def index_change(
    layout: KeyLayout, entry: IndexEntry, host: str, holds: bool
) -> tuple[Compare, Op]:
    """The compare and write that record ``job`` holding (or no longer holding) ``host``.

    The compare guards against another change of the same job's index since
    ``entry`` was read (``index_for_write``). A job across several hosts is
    changed only as a whole: :class:`RequestError` (exit 2) says how.
    """
    if entry.nodes:
        raise _one_share_refused(entry, holds)
    key = layout.job_index(entry.job)
    known = set(entry.hosts or ())
    hosts = sorted(known | {host}) if holds else sorted(known - {host})
    if not hosts:
        return Compare(key, entry.revision), Delete(key)
    return Compare(key, entry.revision), Put(key, JobIndex(entry.job, tuple(hosts)).to_json())


def group_index_change(
    layout: KeyLayout, entry: IndexEntry, nodes: tuple[str, ...], master_port: int | None
) -> tuple[Compare, Op]:
    """The compare and write that record ``job`` across ``nodes`` (none: released everywhere)."""
    key = layout.job_index(entry.job)
    if not nodes:
        return Compare(key, entry.revision), Delete(key)
    index = JobIndex(entry.job, tuple(sorted(nodes)), nodes, master_port)
    return Compare(key, entry.revision), Put(key, index.to_json())


def _one_share_refused(entry: IndexEntry, holds: bool) -> RequestError:
    job, hosts = entry.job, ",".join(entry.nodes)
    if holds:
        return RequestError(
            f"job {job!r} runs across {hosts} as one job: set it with host={hosts} "
            f"(or release it first with `allocator release job={job}`)"
        )
    return RequestError(
        f"job {job!r} runs across {hosts} as one job: release all of it with "
        f"`allocator release job={job}` (without host=)"
    )


def locate_job(
    store: Store, layout: KeyLayout, job: str, on_bad: Callable[[BadRecord], None]
) -> JobLocation:
    """``job``'s assignments on every host, through its index (one key) where it has one."""
    entry = read_index(store, layout, job, on_bad)
    if entry.hosts is None:
        return _scan(store.list(layout.hosts).items, layout, job, on_bad)
    found, damaged = [], []
    for host in entry.nodes or entry.hosts:
        item = store.get(layout.assignment(host, job))
        if item is None:
            continue  # removed by hand: the assignment, not the index, is the truth
        try:
            found.append(decode_record(item.value, Assignment, item.key, job=job, host=host))
        except BadRecord as exc:
            on_bad(exc)
            damaged.append(host)
    return JobLocation(found, damaged, entry.nodes)


def _scan(
    items: Iterable[KeyValue], layout: KeyLayout, job: str, on_bad: Callable[[BadRecord], None]
) -> JobLocation:
    found, damaged = [], []
    for item in items:
        parsed = layout.parse_host_key(item.key)
        if parsed is None or parsed[1] != "jobs" or parsed[2] != job:
            continue
        try:
            found.append(decode_record(item.value, Assignment, item.key, job=job, host=parsed[0]))
        except BadRecord as exc:
            on_bad(exc)
            damaged.append(parsed[0])
    group = next((a for a in found if a.nodes), None)
    if group is not None:  # node-rank order, as the index would give it
        found.sort(key=lambda a: a.node_rank if a.nodes == group.nodes else len(group.nodes))
    return JobLocation(found, damaged, group.nodes if group is not None else ())
