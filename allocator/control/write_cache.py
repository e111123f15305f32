"""What an assignment change is checked against, kept from one write to the next.

A change of one job on one host is decided from the applied policy, the
host's keys (its assignments, generation and agent record), the job's index
entry and the host's history head, and written in one transaction that
compares the revision of every one of them. Since the transaction compares
them, a client may keep that state (a :class:`WriteView`) and decide its
next change from it without reading again, as etcd's STM does: if anything
changed meanwhile, the compare fails, nothing is written, and the failed
transaction brings back the fresh state in the same answer
(:meth:`~allocator.store.base.Store.txn_or_read`). After a write that
succeeded, the client knows the new state without reading: it wrote it.

The policy's YAML is not sent back by a failed write (only its revision);
it is read again only when that revision moved.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from threading import Lock
from typing import TypeVar

from allocator.control.job_index import IndexEntry, complete_index, index_change, index_of
from allocator.errors import BadRecord
from allocator.history.append import (
    Head,
    append_plan,
    head_of,
    oldest_read,
    oldest_times,
    recover_head,
)
from allocator.history.stream import host_stream
from allocator.policy.model import HistorySettings
from allocator.records.codec import decode_record
from allocator.records.fields import SCHEMA_VERSION
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry, PolicyRecord
from allocator.status.snapshots import HostSnapshot, PolicySnapshot, snapshots_by_host
from allocator.store import Compare, KeyValue, Listing, Op, Put, Read, Store

__all__ = [
    "MAX_CACHED",
    "Planned",
    "ViewCache",
    "WriteView",
    "generation_value",
    "plan_change",
    "policy_snapshot",
    "settle_view",
    "shared_snapshot",
    "view_reads",
]

#: Hosts (and jobs) whose state one client keeps; the least recently used goes first.
MAX_CACHED = 256
OnBad = Callable[[BadRecord], None]
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class WriteView:
    """The state a change of ``index.job`` on ``host.host`` is decided from and compares."""

    policy: PolicySnapshot | None
    host: HostSnapshot
    index: IndexEntry
    head: Head


@dataclass(frozen=True, slots=True)
class Planned:
    """One change's transaction, and the view it leaves once applied at a revision."""

    compares: list[Compare]
    ops: list[Op]
    after: Callable[[int], WriteView]


def view_reads(layout: KeyLayout, host: str, job: str, *, policy_text: bool) -> list[Read]:
    """The reads a :class:`WriteView` is built from.

    ``policy_text`` ``False``: the policy's revision only (and not its
    compiled form or shares, only needed when the revision moved). With the
    text come the compiled record and the host's share of the policy (see
    :func:`shared_snapshot`): a change on one host needs no more.
    """
    reads = [
        Read(layout.policy, values=policy_text),
        Read(layout.host(host), prefix=True),
        Read(layout.job_index(job)),
        Read(layout.host_history_head(host)),
        oldest_read(host_stream(layout, host)),  # for history.max_age
    ]
    if policy_text:
        reads.append(Read(layout.compiled_policy))
        reads += [
            Read(layout.shares_head),
            Read(layout.common_share),
            Read(layout.host_share(host)),
        ]
    return reads


def policy_snapshot(
    store: Store,
    layout: KeyLayout,
    item: KeyValue | None,
    on_bad: OnBad,
    compiled: Listing | None = None,
) -> PolicySnapshot | None:
    """The applied policy a read of the policy key holds.

    From its compiled form when that is current (``compiled``: a read of it
    made with the policy key's; else it is read here), else its YAML parsed
    (once per text and process).
    """
    if item is None:
        return None
    from allocator.status.applied_policy import applied_policy

    record = decode_record(item.value, PolicyRecord, item.key)
    return PolicySnapshot(
        applied_policy(store, layout, record, on_bad, compiled), record, item.mod_revision
    )


def shared_snapshot(
    item: KeyValue, shares: Sequence[Listing], host: str, on_bad: OnBad
) -> PolicySnapshot | None:
    """``host``'s share of the applied policy ``item`` holds, when the shares are its.

    ``shares``: reads of the shares' head, the common share and the host's
    share. Used only when the head names this very policy (its apply wrote
    every share; one still writing has marked the head) and the host has a
    share (a host the policy lacks gets the whole policy, whose error lists
    its hosts); else ``None``, and the caller reads the compiled policy.
    """
    from allocator.policy.shares import host_policy

    head, common, mine = (listing.items[0] if listing.items else None for listing in shares)
    if head is None or common is None or mine is None:
        return None
    try:
        record = decode_record(item.value, PolicyRecord, item.key)
    except BadRecord:  # the whole policy's reader reports it, and says how to repair it
        return None
    try:
        policy = host_policy(record.sha256, head.value, common, mine, host)
    except BadRecord as exc:
        on_bad(exc)
        return None
    return PolicySnapshot(policy, record, item.mod_revision, host) if policy else None


def settle_view(
    store: Store,
    layout: KeyLayout,
    host: str,
    job: str,
    found: Sequence[Listing],
    known_policy: PolicySnapshot | None,
    on_bad: OnBad,
) -> WriteView:
    """The view ``found`` (the listings of :func:`view_reads`) describes.

    The policy is decoded only when its revision is not ``known_policy``'s
    (read again if ``found`` holds its revision only). An index or history
    head that is missing or damaged is rebuilt from the store, as the
    single-key readers do.
    """
    policy_read, host_read, index_read, head_read, oldest, *compiled = found
    item = policy_read.items[0] if policy_read.items else None
    if item is None:
        policy = None
    elif (
        known_policy is not None
        and known_policy.revision == item.mod_revision
        and known_policy.host in (None, host)
    ):
        policy = known_policy
    else:
        with_text = bool(item.value)
        policy = shared_snapshot(item, compiled[1:], host, on_bad) if with_text else None
        if policy is None:
            policy = policy_snapshot(
                store,
                layout,
                item if with_text else store.get(layout.policy),
                on_bad,
                compiled[0] if with_text and compiled else None,
            )
    hosts = snapshots_by_host(host_read.items, layout, host_read.revision)
    state = hosts.get(host, HostSnapshot(host, revision=host_read.revision))
    for bad in state.bad_records:
        on_bad(bad)
    index = index_of(index_read.items[0] if index_read.items else None, job, on_bad)
    # An entry missing while this host holds the job was lost (deleted by hand):
    # only a job the host does not hold may be taken at its index's word.
    indexed = policy is not None and policy.record.job_index and job not in state.assignments
    index = complete_index(store, layout, index, on_bad, indexed=indexed)
    stream = host_stream(layout, host)
    head_item = head_read.items[0] if head_read.items else None
    head = head_of(head_item, stream, on_bad)
    if head is None:
        head = recover_head(store, stream, head_item.mod_revision if head_item else 0)
    head = replace(head, oldest=oldest_times(oldest, stream, head))
    return WriteView(policy, state, index, head)


def generation_value(actor: str, at: str) -> bytes:
    """The value a write puts in the generation keys it bumps: who, and when."""
    body = {"schema_version": SCHEMA_VERSION, "by": actor, "at": at}
    return json.dumps(body, sort_keys=True).encode()


def plan_change(
    layout: KeyLayout,
    view: WriteView,
    change: Op,
    entry: HistoryEntry,
    written: Assignment | None,
    *,
    compares: Sequence[Compare] = (),
    history: HistorySettings | None = None,
    generation: bytes,
    lease: int | None = None,
) -> Planned:
    """The transaction that writes ``change`` (the job's key) from ``view`` (pure).

    ``written`` is the assignment ``change`` puts (``None``: it deletes it).
    Compares the host's generation, the job's index entry and the host's
    history head besides ``compares``; bumps the host's and the fleet's
    generations; writes the index and the history entry. ``lease``: the job's
    index entry is written under it, as ``change`` is, so both go when it does.
    """
    state, job = view.host, view.index.job
    host = state.host
    index_compare, index_op = index_change(layout, view.index, host, holds=written is not None)
    if lease is not None and isinstance(index_op, Put):
        index_op = Put(index_op.key, index_op.value, lease)
    head_compare, history_ops, head = append_plan(
        host_stream(layout, host), view.head, entry, history
    )
    ops = [
        change,
        Put(layout.host_generation(host), generation),
        Put(layout.fleet_generation, generation),
        index_op,
        *history_ops,
    ]
    held = {name: a for name, a in state.assignments.items() if name != job}
    if written is not None:
        held[job] = written
    others = set(view.index.hosts or ()) - {host}
    hosts = sorted(others | {host} if written is not None else others)

    def after(revision: int) -> WriteView:
        return WriteView(
            view.policy,
            replace(
                state,
                assignments=held,
                generation=revision,
                revision=revision,
                bad_records=tuple(b for b in state.bad_records if b.key != change.key),
            ),
            IndexEntry(job, tuple(hosts), revision if hosts else 0),
            replace(head, revision=revision),
        )

    # Two compares that every assignment writer moves together, for two promises.
    # The generation: no assignment of the host changed since the view, whoever wrote
    # it, with history or without (a tool restoring a record bumps it, appends nothing).
    # The history head: the stream is where the view left it; the agent appends its
    # own entries (fallback, recover) with no assignment change, and an append from a
    # stale head would overwrite one by reusing its sequence number.
    guards = [*compares, Compare(layout.host_generation(host), state.generation)]
    return Planned([*guards, index_compare, head_compare], ops, after)


class ViewCache:
    """The views one client keeps: the policy, and per host and per job what it last saw.

    Only ever a guess: every write compares what it was decided from.
    """

    def __init__(self, limit: int = MAX_CACHED) -> None:
        self.policy: PolicySnapshot | None = None
        self._hosts: OrderedDict[str, tuple[HostSnapshot, Head]] = OrderedDict()
        self._jobs: OrderedDict[str, IndexEntry] = OrderedDict()
        self._limit = limit
        self._lock = Lock()  # one client may be shared by threads

    def get(self, host: str, job: str) -> WriteView | None:
        """The kept view of ``job`` on ``host``, or ``None`` if part of it is not kept."""
        with self._lock:
            kept, index, policy = self._hosts.get(host), self._jobs.get(job), self.policy
        if kept is None or index is None or policy is None or policy.host not in (None, host):
            return None
        if any(held.run is not None for held in kept[0].assignments.values()):
            # A leased assignment vanishes at its lease's expiry without bumping the
            # host's generation (no client writes then): a kept view could still show
            # it held. Such a host is read afresh for every change.
            return None
        return WriteView(policy, kept[0], index, kept[1])

    def keep(self, view: WriteView) -> None:
        """Remember ``view`` (the newest of its host and job)."""
        with self._lock:
            self.policy = view.policy
            _bounded_put(self._hosts, view.host.host, (view.host, view.head), self._limit)
            _bounded_put(self._jobs, view.index.job, view.index, self._limit)

    def clear(self) -> None:
        """Forget every host and job (after a write made without this cache)."""
        with self._lock:
            self._hosts.clear()
            self._jobs.clear()


def _bounded_put(table: OrderedDict[str, _V], key: str, value: _V, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)
