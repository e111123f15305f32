"""Cancelling a job's pending half: its queue entries.

A waiting request (``set --wait``, ``run --wait``, ``lease(wait=)``) is one
entry under the host's queue. Cancelling deletes the entry in a transaction
that compares its revision, so exactly what was read goes; the waiter sees its
entry gone and stops instead of joining again: the same transaction writes a
short-lived tombstone naming who cancelled (a lapsed lease leaves none, and that
waiter joins again). The running half (holdings) is the ordinary release.
Kept apart from the CLI so that every kind of queued job is cancelled by the
same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.errors import NotFound, NotPermitted
from allocator.recipes.queue.order import Waiting, decode_queue
from allocator.recipes.queue.tombstone import tombstone_ops
from allocator.recipes.queue.view import queue_prefix
from allocator.store import Compare, Delete, Op

if TYPE_CHECKING:
    from allocator.recipes.context import Context
    from allocator.records.types import Assignment

__all__ = [
    "Chosen",
    "cancel_pending",
    "choose",
    "choose_pending",
    "pending_entries",
]


def choose_pending(
    waiting: Iterable[Waiting], job: str | None, asker: str, operator: bool
) -> list[Waiting]:
    """The entries a cancel of ``job`` (every job of ``asker``: ``None``) ends.

    ``NotFound`` when none waits; ``NotPermitted`` when one belongs to
    someone else and ``asker`` is no operator (nothing is chosen then).
    """
    if job is None:
        return [w for w in waiting if w.entry.holder == asker]
    chosen = [w for w in waiting if w.entry.job == job]
    if not chosen:
        raise NotFound(f"job {job!r} waits nowhere")
    others = sorted({w.entry.holder for w in chosen if w.entry.holder != asker})
    if others and not operator:
        raise NotPermitted(f"job {job!r} waits for {', '.join(others)}, not for {asker}")
    return chosen


@dataclass(frozen=True)
class Chosen:
    """What one cancel ends: waiting entries and running holdings."""

    pending: list[Waiting]
    running: list[Assignment]


def choose(
    waiting: Sequence[Waiting],
    held: Sequence[Assignment],
    job: str | None,
    asker: str,
    may_change: Callable[[str], bool],
) -> Chosen:
    """What a cancel of ``job`` (every job of ``asker``: ``None``) ends (pure).

    ``may_change(holder)``: whether ``asker`` may end what ``holder`` has (the
    owner rule of :mod:`allocator.control.owners`). ``NotFound`` when
    nothing matches; ``NotPermitted`` when something is another's and
    ``asker`` may not end it (nothing is chosen then).
    """
    if job is None:
        pending = [w for w in waiting if w.entry.holder == asker]
        running = [a for a in held if a.holder == asker]
        if not pending and not running:
            raise NotFound(f"nothing of {asker}'s waits or runs")
        return Chosen(pending, running)
    running = [a for a in held if a.job == job]
    holders = {w.entry.holder for w in waiting if w.entry.job == job}
    others = {h for h in holders if h != asker}
    try:
        pending = choose_pending(waiting, job, asker, all(may_change(h) for h in others))
    except NotFound:
        if not running:
            raise NotFound(f"job {job!r} neither waits nor runs anywhere") from None
        pending = []
    refused = sorted({a.holder for a in running if a.holder and not may_change(a.holder)})
    if refused:
        raise NotPermitted(f"job {job!r} runs for {', '.join(refused)}, not for {asker}")
    return Chosen(pending, running)


def pending_entries(allocator: Context, host: str | None) -> list[Waiting]:
    """Every queue entry of ``host`` (of every host: ``None``), as read."""
    listing = allocator.store.list(queue_prefix(allocator.layout, host))
    return decode_queue(listing.items, allocator.on_bad_record)


def cancel_pending(allocator: Context, chosen: Iterable[Waiting], by: str = "") -> None:
    """Delete ``chosen`` in one transaction that compares each entry's revision.

    Each leaves a tombstone naming ``by`` (who cancelled) for its waiter.
    """
    entries = list(chosen)
    if not entries:
        return
    ops: list[Op] = [Delete(w.key) for w in entries]
    ops += tombstone_ops(allocator, [w.key for w in entries], by)
    allocator.store.txn([Compare(w.key, w.revision) for w in entries], ops)
