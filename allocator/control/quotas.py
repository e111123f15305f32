"""Quotas: per-subject counters, compared and updated in the assignment's own transaction.

Every assignment records the quota subjects it was counted in
(``Assignment.charged``: ``user:alice``, ``team:a``, ``unix:gpu``, those of
its holder that had a quota when it was written). Each subject has one
counter key (``holders/<kind>/<name>``) holding what it holds now, per pool:
GPUs held whole and slots held of shared GPUs. A write that changes
assignments reads those counters, checks the new totals against the
policy's quotas, and in the same transaction compares each counter's
revision and writes its new value; a release gives back to exactly the
subjects the assignment names. Two racing writes cannot both pass a quota:
the second one's compare fails and it decides again from the new count.
Nothing ever counts by reading the fleet.

A counter is only as good as its writers: a client with write access to
the store can rewrite it (see the manual's trust model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.errors import BadRecord, ConflictError
from allocator.policy.model import Policy, Quota
from allocator.records.holders import HolderCount
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import Compare, KeyValue, Op, Put, Read, Store

__all__ = [
    "Charge",
    "OverQuota",
    "ask_of_entry",
    "counter_key",
    "describe_quota",
    "held_under",
    "plan_charge",
    "quota_refusal",
    "read_counters",
    "usage_of",
]


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
    except BadRecord as bad:  # damaged by hand: reported, then rewritten from zero
        on_bad(bad)
        return HolderCount()


def plan_charge(
    policy: Policy,
    layout: KeyLayout,
    counters: Mapping[str, KeyValue | None],
    before: Sequence[Assignment],
    after: Sequence[Assignment],
    on_bad: Callable[[BadRecord], None] = lambda _bad: None,
) -> Charge:
    """The counter updates of replacing ``before`` with ``after`` (pure; counters given).

    Raises :class:`OverQuota` when a subject that ``after`` charges would
    hold more than a quota allows and holds more than before.
    """
    deltas: dict[str, dict[tuple[str, str], int]] = {}
    for sign, group in ((-1, before), (1, after)):
        for assignment in group:
            pool, gpus, slots = usage_of(policy, assignment)
            for subject in assignment.charged:
                delta = deltas.setdefault(subject, {})
                delta[("gpus", pool)] = delta.get(("gpus", pool), 0) + sign * gpus
                delta[("slots", pool)] = delta.get(("slots", pool), 0) + sign * slots
    compares: list[Compare] = []
    ops: list[Op] = []
    for subject, delta in sorted(deltas.items()):
        if not any(delta.values()):
            continue
        item = counters.get(subject)
        old = _decode(item, on_bad)
        new = _apply(old, delta)
        for quota in policy.quotas:
            if quota.who == subject:
                _check_quota(quota, old, new)
        key = counter_key(layout, subject)
        compares.append(Compare(key, item.mod_revision if item is not None else 0))
        ops.append(Put(key, new.to_json()))
    return Charge(compares, ops)


def _apply(old: HolderCount, delta: Mapping[tuple[str, str], int]) -> HolderCount:
    gpus, slots = dict(old.gpus), dict(old.slots)
    for (unit, pool), change in delta.items():
        table = gpus if unit == "gpus" else slots
        table[pool] = max(0, table.get(pool, 0) + change)
    return HolderCount(
        gpus={p: n for p, n in sorted(gpus.items()) if n},
        slots={p: n for p, n in sorted(slots.items()) if n},
    )


def held_under(quota: Quota, count: HolderCount) -> tuple[int, int]:
    """(GPUs, slots) ``count`` holds in the pools ``quota`` covers."""

    def covered(table: Mapping[str, int]) -> int:
        return sum(n for pool, n in table.items() if not quota.pools or pool in quota.pools)

    return covered(count.gpus), covered(count.slots)


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
) -> str | None:
    """Why asking ``ask`` (GPUs, slots) more in ``pool`` is over a quota now, or ``None``."""
    mine = set(subjects)
    for quota in policy.quotas:
        if quota.who not in mine or (quota.pools and pool not in quota.pools):
            continue
        held = held_under(quota, _decode(counters.get(quota.who), lambda _bad: None))
        for unit, have, more, limit in zip(
            ("GPUs", "slots"), held, ask, (quota.gpus, quota.slots), strict=True
        ):
            if limit is not None and more and have + more > limit:
                return f"over quota {describe_quota(quota)} {have}/{limit} {unit}"
    return None
