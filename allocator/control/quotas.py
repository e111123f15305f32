"""Quotas: per-subject counters, compared and updated in the assignment's own transaction.

Every assignment records the quota subjects it was counted in
(``Assignment.charged``: ``user:alice``, ``team:a``, ``unix:gpu``, those of
its holder that had a quota when it was written). Each subject has one
counter key (``holders/<kind>/<name>``) listing what each of its
assignments counts (pool, GPUs held whole, slots of shared GPUs); the
subject's totals are their sums. A write that changes
assignments reads those counters, checks the new totals against the
policy's quotas, and in the same transaction compares each counter's
revision and writes its new value; a release gives back to exactly the
subjects the assignment names. Two racing writes cannot both pass a quota:
the second one's compare fails and it decides again from the new count.
Nothing ever counts by reading the fleet.

An assignment can vanish without a release: one bound to a lease (``run``)
goes when its lease expires, and no one is there to give back its charge.
So a write that a quota would refuse first reads the assignment keys the
subject's counter lists (what that subject holds, never the fleet), drops
the charges of those that are gone, and compares their absence in its
transaction.

A counter is only as good as its writers: a client with write access to
the store can rewrite it (see the manual's trust model).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.errors import BadRecord, ConflictError, InvalidName
from allocator.policy.model import Policy, Quota
from allocator.records.holders import Charge as HeldCharge
from allocator.records.holders import HolderCount
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import Compare, KeyValue, Op, Put, Read, Store

if TYPE_CHECKING:
    from allocator.control.writer import Writes

__all__ = [
    "MAX_HEALED",
    "Charge",
    "OverQuota",
    "absent_charges",
    "ask_of_entry",
    "charge_name",
    "charged_assignments",
    "counter_key",
    "damaged",
    "describe_quota",
    "healable",
    "held_under",
    "plan_charge",
    "plan_healed",
    "quota_refusal",
    "read_counters",
    "read_gone",
    "report_damaged",
    "usage_of",
]


#: The most vanished charges one write drops (each one's absence is compared).
MAX_HEALED = 16


class OverQuota(ConflictError):
    """The write would take a subject over one of its quotas (exit 3, naming it)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """The compares and writes that keep the counters of one change in step."""

    compares: list[Compare]
    ops: list[Op]


def counter_key(layout: KeyLayout, subject: str) -> str:
    """The counter key of ``subject`` (``team:a`` -> ``.../holders/team/a``)."""
    kind, _, name = subject.partition(":")
    return layout.holder_count(kind, name)


def usage_of(policy: Policy, assignment: Assignment) -> tuple[str, int, int]:
    """(pool, GPUs held whole, slots held of shared GPUs) of ``assignment``."""
    if assignment.mode != "gpu":
        return "", 0, 0
    pool = policy.pool_of(assignment.host)
    name = pool.name if pool is not None else ""
    shared = pool is not None and pool.sharing.shared and not assignment.exclusive
    if shared:
        return name, 0, assignment.slots * len(assignment.gpus)
    return name, len(assignment.gpus), 0


def read_counters(
    store: Store, layout: KeyLayout, subjects: Iterable[str]
) -> dict[str, KeyValue | None]:
    """The counter of each subject, in one request."""
    names = sorted(set(subjects))
    if not names:
        return {}
    found = store.read_many([Read(counter_key(layout, s)) for s in names])
    return {s: (f.items[0] if f.items else None) for s, f in zip(names, found, strict=True)}


def _decode(item: KeyValue | None, on_bad: Callable[[BadRecord], None]) -> HolderCount:
    if item is None:
        return HolderCount()
    try:
        return HolderCount.from_json(item.value)
    except BadRecord as bad:  # damaged by hand: reported; a release rewrites it from zero
        on_bad(BadRecord(item.key, bad.reason))
        return HolderCount()


def damaged(subject: str, item: KeyValue | None) -> str | None:
    """Why ``subject``'s counter cannot be read, or ``None``: a damaged one charges nothing more.

    Read as zero it would let its subject take past the quota; so a write
    that would charge it is refused until an operator repairs it.
    """
    if item is None:
        return None
    try:
        HolderCount.from_json(item.value)
    except BadRecord as bad:
        return (
            f"the quota counter of {subject} is damaged ({bad.reason}): it charges nothing "
            f"more until an operator repairs or deletes {item.key}"
        )
    return None


def charge_name(assignment: Assignment) -> str:
    """The name an assignment's charge goes by in a counter: ``host/job``."""
    return f"{assignment.host}/{assignment.job}"


def plan_charge(
    policy: Policy,
    layout: KeyLayout,
    counters: Mapping[str, KeyValue | None],
    before: Sequence[Assignment],
    after: Sequence[Assignment],
    on_bad: Callable[[BadRecord], None] = lambda _bad: None,
    gone: Collection[str] = (),
) -> Charge:
    """The counter updates of replacing ``before`` with ``after`` (pure; counters given).

    ``gone``: charges (``host/job``) whose assignment key was found absent
    (a lease expired): dropped from every counter; the caller compares their
    absence. Raises :class:`OverQuota` when a subject that ``after`` charges
    would hold more than a quota allows and more than before.
    """
    touched = sorted({s for a in (*before, *after) for s in a.charged})
    compares: list[Compare] = []
    ops: list[Op] = []
    adding = {s for a in after for s in a.charged}
    for subject in touched:
        item = counters.get(subject)
        broken = damaged(subject, item) if subject in adding else None
        if broken is not None:
            raise OverQuota(broken)
        old = _decode(item, on_bad)
        charges = {n: c for n, c in old.charges.items() if n not in gone}
        base = HolderCount(charges=dict(charges))
        for assignment in before:
            if subject in assignment.charged:
                charges.pop(charge_name(assignment), None)
        for assignment in after:
            if subject in assignment.charged:
                pool, gpus, slots = usage_of(policy, assignment)
                if gpus or slots:
                    charges[charge_name(assignment)] = HeldCharge(pool, gpus, slots)
        new = HolderCount(charges=dict(sorted(charges.items())))
        if new == old:
            continue
        for quota in policy.quotas:
            if quota.who == subject:
                _check_quota(quota, base, new)
        key = counter_key(layout, subject)
        compares.append(Compare(key, item.mod_revision if item is not None else 0))
        ops.append(Put(key, new.to_json()))
    return Charge(compares, ops)


def charged_assignments(
    counters: Mapping[str, KeyValue | None], subjects: Iterable[str]
) -> list[str]:
    """Every charge (``host/job``) the counters of ``subjects`` list."""
    names: set[str] = set()
    for subject in subjects:
        names.update(_decode(counters.get(subject), lambda _bad: None).charges)
    return sorted(names)


def held_under(quota: Quota, count: HolderCount) -> tuple[int, int]:
    """(GPUs, slots) ``count`` holds in the pools ``quota`` covers."""

    def covered(table: Mapping[str, int]) -> int:
        return sum(n for pool, n in table.items() if not quota.pools or pool in quota.pools)

    gpus, slots = count.totals()
    return covered(gpus), covered(slots)


def describe_quota(quota: Quota) -> str:
    """``team-a`` or ``team-a in pools a100`` (the name a user knows the quota by)."""
    name = quota.who.partition(":")[2]
    return name + (f" in pools {','.join(quota.pools)}" if quota.pools else "")


def _check_quota(quota: Quota, old: HolderCount, new: HolderCount) -> None:
    old_held, new_held = held_under(quota, old), held_under(quota, new)
    limits = (quota.gpus, quota.slots)
    for unit, before, after, limit in zip(
        ("GPUs", "slots"), old_held, new_held, limits, strict=True
    ):
        if limit is not None and after > limit and after > before:
            raise OverQuota(
                f"over quota {describe_quota(quota)} {before}/{limit} {unit} "
                f"(this asks {after - before} more)"
            )


def ask_of_entry(policy: Policy, host: str, n: int, slots: int | None, job: str) -> tuple[int, int]:
    """(GPUs, slots) a request for ``n`` GPUs of ``host`` would count against quotas."""
    pool = policy.pool_of(host)
    spec = policy.jobs.get(job)
    exclusive = spec is not None and spec.exclusive
    if pool is not None and pool.sharing.shared and not exclusive:
        return 0, n * (slots or 1)
    return n, 0


def quota_refusal(
    policy: Policy,
    subjects: Iterable[str],
    counters: Mapping[str, KeyValue | None],
    pool: str,
    ask: tuple[int, int],
    gone: Collection[str] = (),
) -> str | None:
    """Why asking ``ask`` (GPUs, slots) more in ``pool`` is over a quota now, or ``None``.

    ``gone``: charges (``host/job``) whose assignment was found absent (a
    killed ``run``'s lease expired): they count for nothing.
    """
    mine = set(subjects)
    for quota in policy.quotas:
        if quota.who not in mine or (quota.pools and pool not in quota.pools):
            continue
        broken = damaged(quota.who, counters.get(quota.who))
        if broken is not None:
            return broken
        count = _decode(counters.get(quota.who), lambda _bad: None)
        live = {n: c for n, c in count.charges.items() if n not in gone}
        held = held_under(quota, HolderCount(charges=live))
        for unit, have, more, limit in zip(
            ("GPUs", "slots"), held, ask, (quota.gpus, quota.slots), strict=True
        ):
            if limit is not None and more and have + more > limit:
                return f"over quota {describe_quota(quota)} {have}/{limit} {unit}"
    return None


def healable(
    counters: Mapping[str, KeyValue | None], subjects: Iterable[str], changing: Collection[str]
) -> list[str]:
    """The charges a change refused over a quota looks up (pure): those the counters
    of the ``subjects`` it charges list, but for the ones it moves itself (``changing``)."""
    return [n for n in charged_assignments(counters, sorted(set(subjects))) if n not in changing]


def read_gone(
    store: Store,
    layout: KeyLayout,
    counters: Mapping[str, KeyValue | None],
    subjects: Iterable[str],
    changing: Collection[str],
) -> frozenset[str]:
    """The charges of :func:`healable` whose assignment is gone (one read).

    Each dropped charge costs a compare: at most :data:`MAX_HEALED`, enough
    to make room within one transaction.
    """
    listed = healable(counters, subjects, changing)
    return frozenset(absent_charges(store, layout, listed)[:MAX_HEALED])


def plan_healed(
    policy: Policy,
    layout: KeyLayout,
    counters: Mapping[str, KeyValue | None],
    before: Sequence[Assignment],
    after: Sequence[Assignment],
    gone: Collection[str],
    on_bad: Callable[[BadRecord], None] = lambda _bad: None,
) -> Charge:
    """:func:`plan_charge` without the charges ``gone`` (found absent), comparing their absence.

    Pure: ``gone`` comes from :func:`read_gone`. Still over a quota: ``OverQuota``.
    """
    charge = plan_charge(policy, layout, counters, before, after, on_bad, gone=set(gone))
    keys = (_assignment_key(layout, name) for name in sorted(gone))
    return Charge([*charge.compares, *(Compare(k, 0) for k in keys if k is not None)], charge.ops)


def report_damaged(
    counters: Mapping[str, KeyValue | None],
    subjects: Iterable[str],
    on_bad: Callable[[BadRecord], None],
) -> None:
    """Report each damaged counter of ``subjects`` (a change giving back to them leaves it)."""
    for subject in sorted(subjects):
        _decode(counters.get(subject), on_bad)


def absent_charges(store: Store, layout: KeyLayout, names: Sequence[str]) -> list[str]:
    """Which of the charges ``names`` (``host/job``) have no assignment key (one read)."""
    keys = [_assignment_key(layout, name) for name in names]
    found = store.read_many([Read(key) for key in keys if key]) if any(keys) else ()
    present = {item.key for listing in found for item in listing.items}
    return [n for n, k in zip(names, keys, strict=True) if k is None or k not in present]


def _assignment_key(layout: KeyLayout, name: str) -> str | None:
    """The assignment key of a charge ``host/job`` (``None``: a damaged name, dropped)."""

    host, _, job = name.partition("/")
    try:
        return layout.assignment(host, job)
    except InvalidName:
        return None


def charge(
    writer: Writes,
    policy: Policy,
    before: Sequence[Assignment],
    after: Sequence[Assignment],
) -> tuple[list[Compare], list[Op]]:
    """The quota counters' compares and writes of replacing ``before`` with ``after``.

    Reads the counters of the subjects they charge (nothing when none
    does); raises ``OverQuota`` (exit 3) when a quota would be exceeded.
    """
    subjects = {s for a in (*before, *after) for s in a.charged}
    if not subjects:
        return [], []
    layout, on_bad = writer.layout, writer.on_bad_record
    counters = read_counters(writer.store, layout, subjects)
    try:
        found = plan_charge(policy, layout, counters, before, after, on_bad)
    except OverQuota:  # maybe charges of assignments that vanished: drop them, try again
        adding = {s for a in after for s in a.charged}
        changing = {charge_name(a) for a in (*before, *after)}
        gone = read_gone(writer.store, layout, counters, adding, changing)
        found = plan_healed(policy, layout, counters, before, after, gone, on_bad)
    return found.compares, found.ops
