"""What status reads through: a store, its key layout, and where bad records are reported.

The Allocator (:class:`~allocator.control.client.Allocator`) is one; status
sits below it, so it names only these three of its members here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from allocator.errors import BadRecord
    from allocator.records.keys import KeyLayout
    from allocator.store import Store

__all__ = ["StatusSource"]


class StatusSource(Protocol):
    """A store to read, the layout of its keys, and the report of a record that does not decode."""

    @property
    def store(self) -> Store:
        """The store status reads."""
        ...

    @property
    def layout(self) -> KeyLayout:
        """Where the records live in it."""
        ...

    @property
    def on_bad_record(self) -> Callable[[BadRecord], None]:
        """Reports a record that was skipped (status reads on past it)."""
        ...
