"""What ``policy apply`` must check, and reading it in calls of bounded work.

A policy change can refuse an assignment only where it changes what
placement sees for the assignment's host: the host's own entry, the rules
of its pool (old or new), a reservation on it. Placement reads nothing else
of the policy but which jobs exist, take their GPUs whole (``exclusive``)
and how many workers they run (``workers``, under MPS): a change there, or
a first apply, checks every host. So a one-host change in a
12,500-host fleet reads that host's keys, not the fleet's.

Every read here is bounded: hosts named are read :data:`HOSTS_PER_CALL`
prefixes per call; every host is read as key ranges cut between the
declared hosts, about :data:`HOSTS_PER_CALL` hosts each, one call per
range, all at one revision, where the store can (etcd); elsewhere in one
read. No call's work grows with the fleet, only the number of calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from allocator.policy.model import Policy, Pool
from allocator.records.keys import KeyLayout
from allocator.store import MAX_TXN_OPS, KeyValue, Read, Store

__all__ = [
    "HOSTS_PER_CALL",
    "JOBS_PER_CALL",
    "affected_hosts",
    "read_every_host",
    "read_hosts",
    "read_index_entries",
]

#: Hosts one call reads (a busy host has ~20 keys: ~5,000 keys, well inside
#: the store's call budget on a loaded etcd).
HOSTS_PER_CALL = 256
#: Job index entries one call reads.
JOBS_PER_CALL = 5_000


def affected_hosts(old: Policy | None, new: Policy) -> frozenset[str] | None:
    """The hosts whose assignments going from ``old`` to ``new`` may refuse; ``None``: all."""
    if old is None or _placed_jobs(old) != _placed_jobs(new):
        return None
    changed = {
        name
        for name in old.hosts.keys() | new.hosts.keys()
        if old.hosts.get(name) != new.hosts.get(name)
    }
    for name in old.pools.keys() | new.pools.keys():
        before, after = old.pools.get(name), new.pools.get(name)
        if _rules(before) != _rules(after):
            changed.update(before.hosts if before else (), after.hosts if after else ())
    changed.update(r.host for r in set(old.reservations) ^ set(new.reservations))
    return frozenset(changed)


def _placed_jobs(policy: Policy) -> dict[str, tuple[object, ...]]:
    """What placement reads of the jobs: which exist, which take GPUs whole, their workers."""
    return {name: (job.exclusive, job.workers) for name, job in policy.jobs.items()}


def _rules(pool: Pool | None) -> tuple[object, ...] | None:
    """What placement reads of a pool besides its members."""
    return None if pool is None else (pool.sharing, pool.max_gpus_per_job)


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def read_hosts(
    store: Store, layout: KeyLayout, hosts: Iterable[str]
) -> Iterator[Sequence[KeyValue]]:
    """The keys of each of ``hosts``, read a batch of host prefixes per call."""
    size = max(1, min(HOSTS_PER_CALL, MAX_TXN_OPS))  # a batch is one transaction of reads
    for batch in _chunks(sorted(hosts), size):
        listings = store.read_many([Read(layout.host(host), prefix=True) for host in batch])
        yield [item for listing in listings for item in listing.items]


def read_every_host(
    store: Store,
    layout: KeyLayout,
    declared: Iterable[str],
    revision: int,
) -> Iterator[Sequence[KeyValue]]:
    """Every host's keys as at ``revision``, in key ranges of about :data:`HOSTS_PER_CALL` hosts.

    The ranges cover the whole hosts prefix (hosts no policy declares
    included); ``declared`` only says where to cut them.
    """
    keys = [layout.host(h) for h in declared]
    yield from _ranged(store, layout.hosts, keys, revision, HOSTS_PER_CALL)


def read_index_entries(
    store: Store, layout: KeyLayout, jobs: Iterable[str], revision: int
) -> Iterator[Sequence[KeyValue]]:
    """Every job index entry as at ``revision``, in ranges of about :data:`JOBS_PER_CALL` jobs."""
    keys = [layout.job_index(job) for job in jobs]
    yield from _ranged(store, layout.jobs, keys, revision, JOBS_PER_CALL)


def _ranged(
    store: Store, prefix: str, keys: list[str], revision: int, per_call: int
) -> Iterator[Sequence[KeyValue]]:
    """Every key under ``prefix``: cut at every ``per_call``-th of ``keys`` where the store can."""
    keys.sort()
    splits = keys[per_call::per_call]
    if not splits:
        yield store.list(prefix).items
        return
    for listing in store.list_parts(prefix, revision, splits):
        yield listing.items
