"""What ``allocator status`` reads: the applied policy and every host's records, at one revision.

One batch reads the policy record and its compiled form; the hosts' records
are then read at that batch's revision, on a second thread while this one
decodes the policy and loads the modules that join and print. The hosts
are read in parts cut between the policy's hosts
(:meth:`~allocator.store.base.Store.list_parts`): etcd reads them as
several key ranges at once, as it marshals a fleet's 10 MB answer on one
core per request, and that was most of what status waited for; the other
stores read them whole and cut them. Where the compiled form is missing
the hosts are read in one range.

Policy, assignments, agents and workers then come from one snapshot (the
policy used to be read a moment before the hosts).

A filtered status (``host=``, ``pool=``, ``job=``) reads only the hosts it
picks, in key ranges at the same revision (:mod:`allocator.status.read_hosts`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

import msgspec

from allocator.errors import BadRecord, Compacted, InvalidName, PermissionDenied
from allocator.records.keys import KeyLayout
from allocator.status.source import StatusSource
from allocator.store import KeyValue, Listing, Read, Store, bad_key_records
from allocator.store.parts import ListingReader

if TYPE_CHECKING:
    from allocator.policy.model import Policy

__all__ = [
    "HOSTS_PER_PART",
    "MAX_HOSTS_PER_PART",
    "MAX_PARTS",
    "JoinPart",
    "declared_by_part",
    "host_names",
    "read_status",
    "report_bad_keys",
    "split_points",
]

_Row = TypeVar("_Row")

#: At most this many ranges read at once: etcd marshals each on its own core.
MAX_PARTS = 8
#: No part smaller than this many hosts (~14 keys each): a small fleet is one range.
HOSTS_PER_PART = 100
#: No part larger than this many hosts either (a large fleet gets more parts than
#: MAX_PARTS, still read a few at once): each answer comes well within a call's budget.
MAX_HOSTS_PER_PART = 500


class _PolicyHosts(msgspec.Struct):
    hosts: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)


class _CompiledHosts(msgspec.Struct):
    policy: _PolicyHosts = msgspec.field(default_factory=_PolicyHosts)


_COMPILED_HOSTS = msgspec.json.Decoder(_CompiledHosts)


def host_names(compiled: bytes) -> list[str]:
    """The host names a compiled policy record declares; ``[]`` if it does not read as one.

    Only where to cut the read depends on them (never what is read), so the
    record is not checked here: it is decoded strictly with the policy.
    """
    try:
        return list(_COMPILED_HOSTS.decode(compiled).policy.hosts)
    except msgspec.MsgspecError:
        return []


def split_points(
    layout: KeyLayout,
    hosts: Iterable[str],
    max_parts: int = MAX_PARTS,
    per_part: int = HOSTS_PER_PART,
) -> list[str]:
    """Keys to cut the hosts' prefix at, in key order: parts of about as many hosts each.

    ``max_parts`` parts at most, of ``per_part`` hosts at least, unless that
    makes parts of more than :data:`MAX_HOSTS_PER_PART` hosts.

    Key order is not name order (``node1-a/`` sorts before ``node1/``).
    Invalid names are left out (a cut is only ever a hint).
    """
    keys = sorted(filter(None, (_host_key(layout, h) for h in hosts)))
    parts = min(max_parts, len(keys) // max(1, per_part))
    parts = max(parts, -(-len(keys) // MAX_HOSTS_PER_PART))
    return [keys[len(keys) * i // parts] for i in range(1, parts)]


def _host_key(layout: KeyLayout, host: str) -> str | None:
    """``host``'s prefix, or ``None`` for a name that is no valid host name."""
    try:
        return layout.host(host)
    except InvalidName:
        return None


def _valid_host(layout: KeyLayout, host: str) -> bool:
    return _host_key(layout, host) is not None


#: Joins one part of the hosts' keys, and the policy's hosts that fall in it, into rows.
JoinPart = Callable[["Policy | None", Sequence[KeyValue], Iterable[str]], list[_Row]]


def read_status(
    allocator: StatusSource,
    prefix: str,
    *,
    only_host: str | None,
    while_reading: Callable[[], None],
    join: JoinPart[_Row],
    queue: tuple[str, Callable[[Listing], None]] | None = None,
    pick: Callable[[Policy | None], Sequence[str] | None] | None = None,
) -> tuple[Policy | None, int, list[_Row]]:
    """The applied policy, the revision read at and ``join``'s rows of every key under ``prefix``.

    The policy is ``None`` when none is applied, or its record is damaged
    (reported: status is what an operator reads to find out what is wrong,
    so it must not be the command that stops working when something is).
    ``only_host``: ``prefix`` is that host's, not every host's.
    ``while_reading`` runs on this thread while the hosts are read; ``join``
    is called per part, in key order, as each part is in. ``queue`` (a
    prefix, a callback): the wait queue under that prefix is read in the
    policy's batch and handed to the callback (not at all where the user may
    not read it). ``pick``: given the policy, the hosts to read (sorted;
    ``None``: every host): then only their keys are read
    (:mod:`allocator.status.read_hosts`), after the policy is decoded.
    """
    layout: KeyLayout = allocator.layout
    store = allocator.store
    shares = _share_reads(layout, only_host)
    policy_read, compiled_read, *found = _policy_records(store, layout, queue, shares)
    decoded: list[Policy | None] = []
    if pick is not None:
        while_reading()
        decoded.append(_policy(allocator, _first(policy_read), compiled_read))
        picked = pick(decoded[0])
        if picked is not None:
            rows = _join_picked(allocator, decoded[0], picked, policy_read.revision, join)
            return decoded[0], policy_read.revision, rows

    def policy_of() -> Policy | None:
        if not decoded:
            while_reading()
            first = _first(policy_read)
            decoded.append(_policy(allocator, first, compiled_read, found, only_host))
        return decoded[0]

    compiled = _first(compiled_read)
    splits = split_points(layout, host_names(compiled.value)) if compiled else []
    if only_host is None and not splits and compiled is not None:
        # A compiled policy stored in parts names its hosts only once decoded: a
        # large fleet's, which must not be read in one range (past a call's budget).
        policy = policy_of()
        splits = split_points(layout, policy.hosts) if policy is not None else []
    if only_host is None and splits:
        parts = store.list_parts(prefix, policy_read.revision, splits)
        policy = policy_of()
        try:
            revision, rows = _join_parts(allocator, policy, parts, splits, join)
            return policy, revision, rows
        except Compacted:  # the revision read at is gone already: read the present, whole
            pass
        listing = store.list(prefix)
    else:
        reader = ListingReader(store, prefix)
        reader.start()
        try:
            policy = policy_of()
        finally:
            reader.join()
        listing = reader.result()
    declared = () if policy is None or only_host is not None else policy.hosts
    report_bad_keys(allocator, listing)
    return policy, listing.revision, join(policy, listing.items, declared)


def _join_picked(
    allocator: StatusSource,
    policy: Policy | None,
    picked: Sequence[str],
    revision: int,
    join: JoinPart[_Row],
) -> list[_Row]:
    """``join``'s rows of the ``picked`` hosts only, read in key ranges at ``revision``."""
    from allocator.status.read_hosts import host_runs, picked_items, read_picked

    if not picked:
        return []
    layout: KeyLayout = allocator.layout
    runs = host_runs(layout, picked, policy.hosts if policy is not None else ())
    rows: list[_Row] = []
    for run, listing in zip(
        runs, read_picked(allocator.store, layout, runs, revision), strict=True
    ):
        report_bad_keys(allocator, listing)
        rows.extend(join(policy, picked_items(layout, listing.items, set(run)), run))
    return rows


def report_bad_keys(allocator: StatusSource, listing: Listing) -> None:
    """Report each key of ``listing`` that is not UTF-8 text as a bad record (it was skipped)."""
    for bad in bad_key_records(listing):
        allocator.on_bad_record(bad)


def _join_parts(
    allocator: StatusSource,
    policy: Policy | None,
    parts: Iterable[Listing],
    splits: list[str],
    join: JoinPart[_Row],
) -> tuple[int, list[_Row]]:
    """The revision the parts were read at (the last's) and ``join``'s rows of them."""
    layout: KeyLayout = allocator.layout
    declared = declared_by_part(layout, policy.hosts if policy is not None else (), splits)
    rows: list[_Row] = []
    revision = 0
    for part, hosts in zip(parts, declared, strict=True):
        report_bad_keys(allocator, part)
        rows.extend(join(policy, part.items, hosts))
        revision = part.revision
    return revision, rows


def declared_by_part(
    layout: KeyLayout, hosts: Iterable[str], splits: Sequence[str]
) -> list[list[str]]:
    """``hosts`` grouped by the part of the hosts prefix, cut at ``splits``, their keys fall in.

    ``splits`` as :func:`split_points` makes them: in key order, each once.
    """
    groups: list[list[str]] = [[] for _ in range(len(splits) + 1)]
    for host in hosts:
        groups[bisect.bisect_right(splits, layout.host(host))].append(host)
    return groups


def _share_reads(layout: KeyLayout, host: str | None) -> list[Read]:
    """The reads of one host's share of the policy, its common share and their head."""
    if host is None or not _valid_host(layout, host):
        return []
    return [Read(layout.shares_head), Read(layout.common_share), Read(layout.host_share(host))]


def _policy_records(
    store: Store,
    layout: KeyLayout,
    queue: tuple[str, Callable[[Listing], None]] | None = None,
    shares: Sequence[Read] = (),
) -> tuple[Listing, ...]:
    """The policy record and its compiled form, read in one batch (at one revision).

    A user who may read the policy but not its compiled form (a role
    granted before there was one) still gets status, from the YAML.
    ``queue``: the wait queue under its prefix is read in the same batch
    (and left out for a user who may not read it). ``shares``: read in it
    too, their listings after the two (left out for a user who may not).
    """
    if queue is not None or shares:
        reads = [Read(layout.policy), Read(layout.compiled_policy), *shares]
        reads += [Read(queue[0], prefix=True)] if queue is not None else []
        try:
            policy_read, compiled_read, *rest = store.read_many(reads)
        except PermissionDenied:
            pass
        else:
            if queue is not None:
                queue[1](rest.pop())
            return policy_read, compiled_read, *rest
    try:
        policy_read, compiled_read = store.read_many(
            [Read(layout.policy), Read(layout.compiled_policy)]
        )
    except PermissionDenied:
        policy_read = store.read_many([Read(layout.policy)])[0]
        compiled_read = Listing((), policy_read.revision)
    return policy_read, compiled_read


def _first(listing: Listing) -> KeyValue | None:
    return listing.items[0] if listing.items else None


def _policy(
    allocator: StatusSource,
    item: KeyValue | None,
    compiled: Listing,
    shares: Sequence[Listing] = (),
    host: str | None = None,
) -> Policy | None:
    """The applied policy: ``host``'s share of it when ``shares`` are the policy's, else whole."""
    from allocator.records.codec import decode_record
    from allocator.records.types import PolicyRecord
    from allocator.status.applied_policy import applied_policy

    if item is None:
        return None
    try:
        record = decode_record(item.value, PolicyRecord, item.key)
    except BadRecord as exc:
        allocator.on_bad_record(exc)
        return None
    on_bad = allocator.on_bad_record
    mine = _host_share(record.sha256, shares, host, on_bad) if host is not None else None
    if mine is not None:
        return mine
    return applied_policy(allocator.store, allocator.layout, record, on_bad, compiled)


def _host_share(
    sha256: str, shares: Sequence[Listing], host: str, on_bad: Callable[[BadRecord], None]
) -> Policy | None:
    """``host``'s policy from its share and the common one, if both are stored and current."""
    from allocator.policy.shares import host_policy

    head, common, mine = (_first(listing) for listing in shares) if shares else (None,) * 3
    if head is None or common is None or mine is None:
        return None
    try:
        return host_policy(sha256, head.value, common, mine, host)
    except BadRecord as exc:
        on_bad(exc)
        return None
