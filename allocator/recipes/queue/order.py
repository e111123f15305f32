"""The wait queue's order and who may take what (pure).

Order: a higher ``priority`` first; within one priority, a higher
fair-share factor (less recent usage, :mod:`allocator.recipes.queue.share`;
1 when the policy has no ``fair_share``); then first come first served, by
the store revision that created the entry's key (the store's own clock, the
same for every client). Priority and factor are stored in the entry when
it joins, so every client sorts the queue alike.

The turn rule. A request may take the GPUs it would be placed on only when
no request ahead of it *could use any of them*:

* a request for other GPUs (``gpus=`` that do not overlap) could not;
* a request on another host is in another host's queue, never ahead;
* a ``count=N`` request could use any GPU its host could give it (healthy,
  not reserved for others, within its pool's limit), unless N is more than
  those: such a request cannot be placed now, and nothing waits behind it;
* an entry with no store lease (written by hand, or left by a bug) has no
  waiter alive to keep it: it holds no one up, unless it is a submitted
  job's (``allocator submit``) while the host's agent is alive: that agent is
  its waiter;
* a request whose holder is over a quota now is skipped too (its holder
  must release first); the take compares that holder's counters, so the
  skip holds only while they do not move.

So a large request is never starved by a stream of small ones: every
request behind it that could use any GPU it waits for waits behind it,
and the GPUs freed one by one are left for it (no backfill past a request
that could use them). Requests for GPUs it will not use pass it.

Preemptible entries (``--preemptible``) sort after every normal one. A
normal entry ahead holds one up only when it would fit with every
preemptible holding gone (it is about to take those GPUs, or to take them
back: :mod:`allocator.recipes.queue.preempt`); one that cannot fit anyway
does not. So no GPU idles while a preemptible job waits, and no normal
request waits behind one for longer than its grace.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from allocator.errors import BadRecord
from allocator.records.holders import QueueEntry
from allocator.store import KeyValue

__all__ = ["Able", "Waiting", "blockers", "could_use", "decode_queue", "in_order", "wanted_ahead"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """One entry of a host's queue as read: its key, record and revisions."""

    key: str
    entry: QueueEntry
    arrived: int  # the store revision that created the key
    revision: int  # its current mod_revision (what a take compares)
    leased: bool = True  # written with a store lease: a live waiter keeps it

    @property
    def name(self) -> str:
        """The entry's name (the last part of its key)."""
        return self.key.rsplit("/", 1)[-1]


def decode_queue(
    items: Iterable[KeyValue], on_bad: Callable[[BadRecord], None], *, agent_alive: bool = True
) -> list[Waiting]:
    """The entries of ``items`` in queue order; a damaged one is reported and skipped.

    ``agent_alive``: the host's agent's leased record is there; a submitted
    job's entry is live while it is (the agent is that entry's waiter).
    """
    found = []
    for item in items:
        try:
            entry = QueueEntry.from_json(item.value)
        except BadRecord as bad:
            on_bad(BadRecord(item.key, bad.reason))
            continue
        # A submitted job has no waiting process: the host's agent is its waiter.
        leased = bool(item.lease) or (bool(entry.submission) and agent_alive)
        found.append(Waiting(item.key, entry, item.create_revision, item.mod_revision, leased))
    return in_order(found)


def in_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Normal before preemptible, higher priority, higher fair-share factor, first come."""
    return sorted(waiting, key=_place)


def _place(waiting: Waiting) -> tuple[bool, int, float, int, str]:
    entry = waiting.entry
    factor = 1.0 if entry.fair_share is None else entry.fair_share  # no fair share: all alike
    return (entry.preemptible, -entry.priority, -factor, waiting.arrived, waiting.key)


#: The GPUs a waiting request could be given on its host (health, reservations, limits).
Able = Callable[[QueueEntry], Collection[int]]


def could_use(entry: QueueEntry, gpus: Sequence[int], able: Collection[int]) -> bool:
    """Whether ``entry`` could use any of ``gpus``, given the GPUs ``able`` it could be given."""
    if entry.gpus is not None:
        wanted = set(entry.gpus)
        return wanted.issubset(able) and not wanted.isdisjoint(gpus)
    if entry.count is None or entry.count > len(able):
        return False  # it cannot be placed now: it holds no one up
    return not set(able).isdisjoint(gpus)


def blockers(
    order: Sequence[Waiting],
    me: str | None,
    gpus: Sequence[int],
    able: Able,
    over_quota: Callable[[Waiting], bool] = lambda _w: False,
    *,
    normal_fits: Callable[[Waiting], bool] | None = None,
) -> list[Waiting]:
    """The entries ahead of ``me`` (all, when ``me`` is ``None``) that could use ``gpus``.

    ``normal_fits``: given when ``me`` is preemptible; a normal entry ahead
    holds it up only when it fits with every preemptible holding gone (it
    is about to take its GPUs, or to take them back), so no GPU idles that
    no normal request can have.
    """
    found = []
    for waiting in order:
        if waiting.key == me:
            break
        if not waiting.leased:
            continue
        wanted = could_use(waiting.entry, gpus, able(waiting.entry)) and not over_quota(waiting)
        if wanted and (normal_fits is None or waiting.entry.preemptible or normal_fits(waiting)):
            found.append(waiting)
    return found


def wanted_ahead(
    order: Sequence[Waiting],
    me: str | None,
    gpus: Sequence[int],
    able: Able,
    over_quota: Callable[[Waiting], bool] = lambda _w: False,
    *,
    normal_fits: Callable[[Waiting], bool] | None = None,
) -> set[int]:
    """Which of ``gpus`` some entry ahead of ``me`` could use (a count waiter avoids them)."""
    return {g for g in gpus if blockers(order, me, (g,), able, over_quota, normal_fits=normal_fits)}
