"""``/api/v1/usage``: the same document as ``allocator usage -o json``, and the page's top holders.

History is read whole on request, as ``allocator usage`` reads it; an
answer is kept for :data:`KEEP_SECONDS` per query, so a page open on many
screens costs one read of history per interval, not one per screen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from allocator.errors import AllocatorError, InvalidInput
from allocator.records.keys import KeyLayout
from allocator.serve.history import error_answer
from allocator.store import Store

__all__ = ["KEEP_SECONDS", "UsageAnswers"]

#: How long one answer serves the same query.
KEEP_SECONDS = 30.0
#: Most rows one answer carries (``limit=``; the report says how many there were).
MAX_ROWS = 1000


class UsageAnswers:
    """Answers to usage queries, each kept a while (thread-safe)."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        layout: KeyLayout,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_store = open_store
        self._layout = layout
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str, int], tuple[float, dict[str, Any]]] = {}

    def answer(self, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, document) for ``?since=30d&by=user&limit=N``."""
        try:
            key = _parsed(query)
        except InvalidInput as exc:
            return error_answer(exc)
        now = self._clock()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and now - kept[0] < KEEP_SECONDS:
                return 200, kept[1]
        try:
            document = self._read(*key)
        except AllocatorError as exc:
            return error_answer(exc)
        with self._lock:
            self._kept = {k: v for k, v in self._kept.items() if now - v[0] < KEEP_SECONDS}
            self._kept[key] = (now, document)
        return 200, document

    def _read(self, since_text: str, by: str, limit: int) -> dict[str, Any]:
        from allocator.control.client import Allocator
        from allocator.control.history import parse_since
        from allocator.control.usage_report import usage_report
        from allocator.util.times import utc_now

        now = utc_now()
        since = parse_since(since_text, now)
        store = self._open_store()
        try:
            allocator = Allocator(store, prefix=self._layout.prefix)
            document, _rows = usage_report(allocator, since, by, now, limit=limit)
        finally:
            store.close()
        return document


def _parsed(query: Mapping[str, str]) -> tuple[str, str, int]:
    from allocator.control.usage import BY

    since = query.get("since", "30d")
    by = query.get("by", "user")
    if by not in BY:
        raise InvalidInput(f"by={by!r}: expected one of {', '.join(BY)}")
    raw = query.get("limit", str(MAX_ROWS))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_ROWS:
        raise InvalidInput(f"limit={raw!r}: expected a whole number from 1 to {MAX_ROWS}")
    return since, by, int(raw)
