"""Reading some hosts' keys, not the fleet's: a filtered status (``host=``, ``pool=``, ``job=``).

The hosts picked are read in key ranges: hosts next to each other in key
order (among the policy's hosts and those picked) are one range, so
``host=node[0000-0099]`` is one range read however large the fleet. Too
many ranges (a pool of every other host) are merged across the smallest
gaps; whatever a merged range holds of hosts not picked is left out
(:func:`picked_items`). On etcd the ranges are read at the revision the
policy was read at, a few at once; on the other stores each host is one
prefix read of a batch (``MAX_TXN_OPS`` to a batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from allocator.records.keys import KeyLayout, split_host_key
from allocator.status.source import StatusSource
from allocator.store import KeyValue, Listing, Read, Store

__all__ = [
    "HOSTS_PER_RANGE",
    "MAX_RANGES",
    "host_runs",
    "job_hosts",
    "picked_items",
    "read_picked",
]

#: At most this many ranges for one filtered read (more are merged across the smallest gaps).
MAX_RANGES = 64
#: No range longer than this many hosts (~14 keys each): each answer stays small, and
#: etcd marshals several at once.
HOSTS_PER_RANGE = 500


def host_runs(
    layout: KeyLayout,
    picked: Iterable[str],
    declared: Iterable[str],
    max_ranges: int = MAX_RANGES,
    per_range: int = HOSTS_PER_RANGE,
) -> list[list[str]]:
    """``picked`` hosts in runs next to each other in key order: one key range each.

    ``declared``: the other hosts whose keys may lie between (the policy's).
    A run holds the picked hosts it covers (a merged run also covers hosts
    not picked, read and left out), in key order.
    """
    wanted = set(picked)
    order = sorted(wanted.union(declared), key=layout.host)
    runs: list[list[int]] = []  # positions in ``order``
    for position, host in enumerate(order):
        if host not in wanted:
            continue
        if runs and runs[-1][-1] == position - 1:
            runs[-1].append(position)
        else:
            runs.append([position])
    runs = _merged(runs, max_ranges)
    return [
        [order[p] for p in run[start : start + per_range]]
        for run in runs
        for start in range(0, len(run), per_range)
    ]


def _merged(runs: list[list[int]], max_ranges: int) -> list[list[int]]:
    """``runs`` with the smallest gaps between them closed: at most ``max_ranges`` left."""
    if len(runs) <= max_ranges:
        return runs
    gaps = sorted(range(1, len(runs)), key=lambda i: runs[i][0] - runs[i - 1][-1])
    cuts = sorted(gaps[len(runs) - max(1, max_ranges) :])
    merged: list[list[int]] = []
    start = 0
    for cut in [*cuts, len(runs)]:
        merged.append([p for run in runs[start:cut] for p in run])
        start = cut
    return merged


def picked_items(layout: KeyLayout, items: Sequence[KeyValue], picked: set[str]) -> list[KeyValue]:
    """The items of ``picked`` hosts (a range may cover others between them)."""
    hosts = layout.hosts
    kept = []
    for item in items:
        parsed = split_host_key(item.key, hosts)
        if parsed is not None and parsed[0] in picked:
            kept.append(item)
    return kept


def read_picked(
    store: Store, layout: KeyLayout, runs: Sequence[Sequence[str]], revision: int
) -> Iterator[Listing]:
    """One listing per run of :func:`host_runs`, in order (etcd: as at ``revision``)."""
    return store.list_runs([[layout.host(host) for host in run] for run in runs], revision)


def job_hosts(allocator: StatusSource, jobs: Sequence[str]) -> list[str] | None:
    """The hosts the job index names for ``jobs``; ``None`` when one has no usable entry.

    (A store written before the index, an entry damaged by hand, or a role
    that may read the hosts but not the index: then every host is read.)
    """
    from allocator.errors import BadRecord, PermissionDenied
    from allocator.records.codec import decode_record
    from allocator.records.types import JobIndex

    reads = [Read(allocator.layout.job_index(job)) for job in jobs]
    try:
        listings = allocator.store.read_many(reads)
    except PermissionDenied:
        return None
    found: list[str] = []
    for job, listing in zip(jobs, listings, strict=True):
        if not listing.items:
            return None
        item = listing.items[0]
        try:
            found.extend(decode_record(item.value, JobIndex, item.key, job=job).hosts)
        except BadRecord as exc:
            allocator.on_bad_record(exc)
            return None
    return found
