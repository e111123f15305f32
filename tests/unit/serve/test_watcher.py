"""The watcher behind ``allocator serve``: a store that hangs is shown as down, then up again."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from allocator.errors import StoreUnavailable
from allocator.records.keys import KeyLayout
from allocator.serve.mirror import FleetMirror
from allocator.serve.watcher import FleetWatcher
from allocator.store import Store, open_store
from tests.support.waiting import wait_for

LAYOUT = KeyLayout("/a")
#: The double's call deadline while hung (etcd's is the URL's ``timeout``).
DEADLINE_S = 0.2


class HangingStore:
    """A memory store whose reads, while ``hung`` is set, wait out a deadline and fail.

    That is what a stopped etcd looks like from here: its watch stays open
    and silent, and every call ends at the client's deadline.
    """

    def __init__(self, inner: Store, hung: threading.Event, reads: list[float]) -> None:
        self._inner = inner
        self._hung = hung
        self._reads = reads

    def _call(self, name: str, *args: Any) -> Any:
        self._reads.append(time.monotonic())
        if self._hung.is_set():
            time.sleep(DEADLINE_S)
            raise StoreUnavailable("the store gave no answer (timed out)")
        return getattr(self._inner, name)(*args)

    def list(self, prefix: str) -> Any:
        return self._call("list", prefix)

    def read_many(self, reads: Any) -> Any:
        return self._call("read_many", reads)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_store_that_hangs_under_a_quiet_watch_is_down_within_its_deadline_then_up() -> None:
    url = f"memory://{uuid.uuid4().hex}"
    hung = threading.Event()
    reads: list[float] = []
    quiet = 0.3
    watcher = FleetWatcher(
        lambda: HangingStore(open_store(url), hung, reads),  # type: ignore[arg-type,return-value]
        FleetMirror(LAYOUT),
        lambda: None,
        retry_max_seconds=0.2,
        quiet_seconds=quiet,
    )
    watcher.start()
    try:
        wait_for("the first read", lambda: watcher.state.up, timeout=10)
        checks = len(reads)
        wait_for("a check of the quiet watch", lambda: len(reads) > checks, timeout=10)
        assert watcher.state.up  # a store that answers the check stays up

        hung.set()
        since = time.monotonic()
        wait_for("the hung store to show as down", lambda: not watcher.state.up, timeout=10)
        # Down once a check ran into its deadline: no sooner than that deadline.
        assert time.monotonic() - since >= DEADLINE_S
        assert "no answer" in watcher.state.error and watcher.state.since

        hung.clear()
        wait_for("the store to be up again", lambda: watcher.state.up, timeout=10)
    finally:
        watcher.stop()
