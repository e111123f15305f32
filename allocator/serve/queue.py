"""``/api/v1/queue``: the same document as ``allocator queue -o json``.

Read from the store on request, as history is: queue entries are not
mirrored (they come and go with their waiters' leases).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from allocator.errors import AllocatorError
from allocator.records.keys import KeyLayout
from allocator.store import Store

__all__ = ["queue_json"]


def queue_json(open_store: Callable[[], Store], layout: KeyLayout) -> tuple[int, dict[str, Any]]:
    """(HTTP status, document) of every waiting request, with why it waits."""
    from allocator.control.client import Allocator
    from allocator.recipes.queue.view import queue_lines
    from allocator.util.times import utc_now

    try:
        store = open_store()
        try:
            lines = queue_lines(Allocator(store, prefix=layout.prefix), utc_now())
        finally:
            store.close()
    except AllocatorError as exc:
        status = {4: 503, 5: 403}.get(exc.exit_code, 500)
        return status, {
            "error": "queue unavailable",
            "exit_code": exc.exit_code,
            "message": str(exc),
        }
    return 200, {"queue": [line.to_dict() for line in lines]}
