"""The agent's connection to the store: reads, watches and retry timing.

Watches run in threads (one store handle each, since backends such as
SQLite must not share a connection across threads) and push batches of
events, or the error that ended them, onto one queue; the agent's loop waits
on that queue with a timeout, so it sleeps while nothing happens and never
spins while the store is down.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from allocator.errors import AllocatorError, Compacted, Retryable
from allocator.store import Event, Store

__all__ = ["RetryTimer", "WatchError", "WatchEvents", "WatchThread"]


@dataclass(frozen=True, slots=True)
class WatchEvents:
    """A batch of events from one watched prefix."""

    prefix: str
    events: tuple[Event, ...]


@dataclass(frozen=True, slots=True)
class WatchError:
    """A watch ended: the store went away, or history was compacted."""

    prefix: str
    error: AllocatorError


Message = WatchEvents | WatchError


class WatchThread:
    """Watch one prefix from a revision in a daemon thread, feeding ``inbox``."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        prefix: str,
        start_revision: int,
        inbox: queue.Queue[Message],
        poll_seconds: float = 1.0,
    ) -> None:
        self._open_store = open_store
        self.prefix = prefix
        self._start = start_revision
        self._inbox = inbox
        self._poll = poll_seconds
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {prefix}", daemon=True)

    def start(self) -> None:
        """Begin watching."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; it does within one poll interval."""
        self._stopping.set()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end."""
        self._thread.join(timeout)

    def _run(self) -> None:
        store: Store | None = None
        try:
            store = self._open_store()
            watch = store.watch(self.prefix, self._start)
            try:
                while not self._stopping.is_set():
                    events = watch.next(self._poll)
                    if events and not self._stopping.is_set():
                        self._inbox.put(WatchEvents(self.prefix, tuple(events)))
            finally:
                watch.close()
        except (Retryable, Compacted) as exc:
            self._inbox.put(WatchError(self.prefix, exc))
        except AllocatorError as exc:  # permission and similar: reported, retried by the loop
            self._inbox.put(WatchError(self.prefix, exc))
        finally:
            if store is not None:
                store.close()


def start_watches(
    open_store: Callable[[], Store],
    prefixes: Sequence[str],
    start_revision: int,
    inbox: queue.Queue[Message],
) -> list[WatchThread]:
    """Start one :class:`WatchThread` per prefix."""
    threads = [WatchThread(open_store, p, start_revision, inbox) for p in prefixes]
    for thread in threads:
        thread.start()
    return threads


class RetryTimer:
    """When to try the store again: capped, jittered exponential backoff (tenacity's)."""

    def __init__(self, cap_seconds: float, base_seconds: float = 0.5) -> None:
        from tenacity import wait_random_exponential

        self._wait = wait_random_exponential(multiplier=base_seconds, max=cap_seconds)
        self.failures = 0

    def failed(self, now: float) -> float:
        """Record a failure; return the time of the next attempt."""
        from tenacity import RetryCallState

        self.failures += 1
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = self.failures
        return now + float(self._wait(state))

    def succeeded(self) -> None:
        """Reset after a success."""
        self.failures = 0
