"""The wait queue's order and who may take what (pure).

Order: a higher ``priority`` first; within one priority, first come first
served, by the store revision that created the entry's key (the store's
own clock, the same for every client).

The turn rule. A request may take the GPUs it would be placed on only when
no request ahead of it *could use any of them*:

* a request for other GPUs (``gpus=`` that do not overlap) could not;
* a request on another host is in another host's queue, never ahead;
* a ``count=N`` request could use any GPU of its host, unless N is more
  than the host has usable (healthy) GPUs: such a request cannot fit, and
  nothing waits behind it;
* a request whose holder is over a quota now is skipped too (its holder
  must release first); the take compares that holder's counters, so the
  skip holds only while they do not move.

So a large request is never starved by a stream of small ones: every
request behind it that could use any GPU it waits for waits behind it,
and the GPUs freed one by one are left for it (no backfill past a request
that could use them). Requests for GPUs it will not use pass it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from allocator.errors import BadRecord
from allocator.records.holders import QueueEntry
from allocator.store import KeyValue

__all__ = ["Waiting", "blockers", "could_use", "decode_queue", "in_order"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """One entry of a host's queue as read: its key, record and revisions."""

    key: str
    entry: QueueEntry
    arrived: int  # the store revision that created the key
    revision: int  # its current mod_revision (what a take compares)

    @property
    def name(self) -> str:
        """The entry's name (the last part of its key)."""
        return self.key.rsplit("/", 1)[-1]


def decode_queue(items: Iterable[KeyValue], on_bad: Callable[[BadRecord], None]) -> list[Waiting]:
    """The entries of ``items`` in queue order; a damaged one is reported and skipped."""
    found = []
    for item in items:
        try:
            entry = QueueEntry.from_json(item.value)
        except BadRecord as bad:
            on_bad(BadRecord(item.key, bad.reason))
            continue
        found.append(Waiting(item.key, entry, item.create_revision, item.mod_revision))
    return in_order(found)


def in_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """Higher priority first, then first come first served."""
    return sorted(waiting, key=lambda w: (-w.entry.priority, w.arrived, w.key))


def could_use(entry: QueueEntry, gpus: Sequence[int], usable: int) -> bool:
    """Whether ``entry`` could use any of ``gpus`` on a host with ``usable`` healthy GPUs."""
    if entry.gpus is not None:
        return not set(entry.gpus).isdisjoint(gpus)
    return entry.count is not None and entry.count <= usable


def blockers(
    order: Sequence[Waiting],
    me: str | None,
    gpus: Sequence[int],
    usable: int,
    over_quota: Callable[[Waiting], bool] = lambda _w: False,
) -> list[Waiting]:
    """The entries ahead of ``me`` (all, when ``me`` is ``None``) that could use ``gpus``."""
    found = []
    for waiting in order:
        if waiting.key == me:
            break
        if could_use(waiting.entry, gpus, usable) and not over_quota(waiting):
            found.append(waiting)
    return found
