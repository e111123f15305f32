"""The tombstone a cancel leaves where it deleted a queue entry: who cancelled it.

Written in the cancel's own transaction and leased, so it goes by itself
soon after. A waiter that finds its entry gone reads it to tell a cancel
(it stops, :class:`Cancelled`) from a lapsed lease (it joins again).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from allocator.errors import ConflictError
from allocator.store import Op, Put

if TYPE_CHECKING:
    from allocator.recipes.context import Context

__all__ = ["TOMBSTONE_TTL_S", "Cancelled", "cancelled_by", "tombstone_ops"]

#: How long a tombstone outlives the entry: a waiter looks at least every few seconds.
TOMBSTONE_TTL_S = 60.0


class Cancelled(ConflictError):
    """This waiter's request was cancelled (``allocator cancel``): it stops, exit 3."""


def tombstone_ops(allocator: Context, entry_keys: Iterable[str], by: str) -> list[Op]:
    """The puts of each entry's tombstone naming ``by``, under a new lease."""
    keys = list(entry_keys)
    if not keys:
        return []
    lease = allocator.store.grant_lease(TOMBSTONE_TTL_S)
    layout = allocator.layout
    return [Put(layout.queue_cancel(key), by.encode(), lease=lease) for key in keys]


def cancelled_by(allocator: Context, entry_key: str) -> str | None:
    """Who cancelled the entry at ``entry_key`` ("" if unknown), ``None`` if nobody did."""
    found = allocator.store.get(allocator.layout.queue_cancel(entry_key))
    if found is None:
        return None
    return found.value.decode(errors="replace")
