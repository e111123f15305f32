"""A preemptible holding hears at once that a normal request took its GPUs back.

The waiter that takes them back marks the holding's assignment
(``preempted_by``, :mod:`allocator.recipes.queue.preempt`); this thread
watches that one key and tells the holder the moment the mark lands, so the
hand-off costs one watch hop, not a poll's period. The holding's lease
keeper also looks at each refresh, should the watch break.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from allocator.errors import AllocatorError, BadRecord
from allocator.records.types import Assignment
from allocator.store import KeyValue, Store, Watch

__all__ = ["PreemptWatch", "preempted_by"]

#: How long a watch waits per look, and after a broken one before it starts again.
LOOK_S = 0.5


def preempted_by(raw: bytes | None) -> str:
    """Who a stored assignment says took its GPUs back ("" for no one, or not readable)."""
    if raw is None:
        return ""
    try:
        return Assignment.from_json(raw).preempted_by
    except BadRecord:
        return ""


class PreemptWatch:
    """Watches ``key`` from a daemon thread; calls ``tell(job)`` when it is marked preempted."""

    def __init__(self, store: Store, key: str, tell: Callable[[str], None]) -> None:
        self.store, self.key, self.tell = store, key, tell
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="allocator-preempt", daemon=True)

    def start(self) -> None:
        """Begin watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (returns within a look)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * LOOK_S + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            watch: Watch | None = None
            try:
                watch = self._open()
                if self._marked(self.store.get(self.key)):  # a mark before the watch began
                    return
                while not self._stop.is_set():
                    for event in watch.next(LOOK_S):
                        if event.key == self.key and preempted_by(event.value):
                            self.tell(preempted_by(event.value))
                            return
            except AllocatorError:  # a broken or compacted watch: start again
                self._stop.wait(LOOK_S)
            finally:
                if watch is not None:
                    with contextlib.suppress(AllocatorError):
                        watch.close()

    def _open(self) -> Watch:
        start = self.store.list(self.key, limit=1).revision + 1
        return self.store.watch(self.key, start)

    def _marked(self, found: KeyValue | None) -> bool:
        by = preempted_by(found.value if found is not None else None)
        if by:
            self.tell(by)
        return bool(by)
