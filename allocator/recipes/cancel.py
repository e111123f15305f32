"""Cancelling a job's pending half: its queue entries.

A waiting request (``set --wait``, ``run --wait``, ``lease(wait=)``) is one
entry under the host's queue. Cancelling deletes the entry in a transaction
that compares its revision, so exactly what was read goes; the waiter sees its
entry gone and stops instead of joining again. The running half (holdings) is
the ordinary release. Kept apart from the CLI so that every kind of queued job
is cancelled by the same code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from allocator.errors import NotFound, PermissionDenied
from allocator.recipes.queue.order import Waiting, decode_queue
from allocator.recipes.queue.view import queue_prefix
from allocator.store import Compare, Delete

if TYPE_CHECKING:
    from allocator.recipes.context import Context

__all__ = ["cancel_pending", "choose_pending", "pending_entries"]


def choose_pending(
    waiting: Iterable[Waiting], job: str | None, asker: str, operator: bool
) -> list[Waiting]:
    """The entries a cancel of ``job`` (every job of ``asker``: ``None``) ends.

    ``NotFound`` when none waits; ``PermissionDenied`` when one belongs to
    someone else and ``asker`` is no operator (nothing is chosen then).
    """
    if job is None:
        return [w for w in waiting if w.entry.holder == asker]
    chosen = [w for w in waiting if w.entry.job == job]
    if not chosen:
        raise NotFound(f"job {job!r} waits nowhere")
    others = sorted({w.entry.holder for w in chosen if w.entry.holder != asker})
    if others and not operator:
        raise PermissionDenied(f"job {job!r} waits for {', '.join(others)}, not for {asker}")
    return chosen


def pending_entries(allocator: Context, host: str | None) -> list[Waiting]:
    """Every queue entry of ``host`` (of every host: ``None``), as read."""
    listing = allocator.store.list(queue_prefix(allocator.layout, host))
    return decode_queue(listing.items, allocator.on_bad_record)


def cancel_pending(allocator: Context, chosen: Iterable[Waiting]) -> None:
    """Delete ``chosen`` in one transaction that compares each entry's revision."""
    entries = list(chosen)
    if entries:
        compares = [Compare(w.key, w.revision) for w in entries]
        allocator.store.txn(compares, [Delete(w.key) for w in entries])
