"""When the batch runner reads the store: on a change of its host, never by polling the fleet.

A fleet's agents each run one: a watch on the store's root (every change
of every host woken in every agent) or a fast poll would cost the store in
proportion to the fleet. So the runner watches its own host's queue (a
submission arriving) and its host's keys (GPUs released), and reads again:

* at once after such a change;
* every :data:`RECHECK_S` while a submitted job waits (a quota counter or a
  reservation's window, which are not its host's keys, may let it in), as a
  waiter does;
* every :data:`SWEEP_S` otherwise (or the agent's resync interval, on a large
  fleet), for the records of cancelled jobs.

Between reads the runner ticks every :data:`TICK_S` to reap its commands
(no store call).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from allocator.errors import AllocatorError
from allocator.records.keys import KeyLayout
from allocator.store import Store, Watch

__all__ = ["RECHECK_S", "SWEEP_S", "TICK_S", "Wakeups"]

#: How often the runner reaps its commands' exits.
TICK_S = 0.25
#: How often it reads again while a submitted job waits and nothing of its host changed.
RECHECK_S = 2.0
#: How often it reads when nothing waits (the sweep of cancelled jobs' records).
SWEEP_S = 30.0


class Wakeups:
    """The runner's watches of its host, and when its next store read is due."""

    def __init__(
        self,
        layout: KeyLayout,
        host: str,
        clock: Callable[[], float],
        sweep_seconds: Callable[[], float] = lambda: SWEEP_S,
    ) -> None:
        self.prefixes = (layout.host_queue(host), layout.host(host))
        self.clock = clock
        # The agent's resync interval, which grows with the fleet (agent/sync/pacing.py):
        # the sweep is a safety net under the watches, as the resync is.
        self.sweep_seconds = sweep_seconds
        self.watches: list[Watch] = []
        self.changed = True  # the first read is due at once
        self.last_read = float("-inf")

    def due(self, waiting: bool) -> bool:
        """Whether to read the store now (``waiting``: a submitted job waits for its turn)."""
        every = RECHECK_S if waiting else max(SWEEP_S, self.sweep_seconds())
        return self.changed or self.clock() - self.last_read >= every

    def read(self) -> None:
        """A read was made: what changed before it is seen."""
        self.changed = False
        self.last_read = self.clock()

    def wait(self, store: Store, tick: float = TICK_S) -> None:
        """Up to ``tick`` seconds, noting whether the host's queue or keys changed."""
        if not self.watches:
            start = store.list(self.prefixes[0], limit=1).revision + 1
            self.watches = [store.watch(p, start) for p in self.prefixes]
            self.changed = True  # a change before the watches began would go unseen
            return
        # Blocked on the queue's watch (where a submission arrives, which ends the wait
        # at once), then a glance at the host's keys (GPUs released: seen within a tick).
        queue_watch, host_watch = self.watches
        if queue_watch.next(tick) or host_watch.next(0.001):
            self.changed = True

    def close(self) -> None:
        """End the watches (a broken one, or the runner's end); the next wait starts anew."""
        for watch in self.watches:
            with contextlib.suppress(AllocatorError):
                watch.close()
        self.watches = []
