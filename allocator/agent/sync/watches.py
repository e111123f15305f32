"""Pieces of the agent's store link: watch threads and their messages.

Watches run in threads (one store handle each, since backends such as
SQLite must not share a connection across threads) and push batches of
events, or the error that ended them, onto the link's queue; the link waits
on that queue with a timeout, so it sleeps while nothing happens and never
spins while the store is down. Each batch of watches carries an ``epoch``:
a message from a watch the link has already replaced is recognised and
dropped, so a late error from an old watch cannot tear down a new connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from allocator.errors import AllocatorError
from allocator.records.keys import KeyLayout
from allocator.store import Event, Store

__all__ = [
    "Message",
    "Sink",
    "WatchError",
    "WatchEvents",
    "WatchThread",
    "agent_watch_keys",
    "start_watches",
]


def agent_watch_keys(
    layout: KeyLayout, host: str, *, whole_policy: bool = False
) -> tuple[str, ...]:
    """The keys and prefixes the agent of ``host`` watches (other hosts of its jobs aside).

    Its assignments, its share of the policy and the common share; the
    whole policy record instead of the shares only while none are stored
    (a policy applied by an older version).
    """
    if whole_policy:
        return layout.host_jobs(host), layout.policy
    return layout.host_jobs(host), layout.common_share, layout.host_share_prefix(host)


@dataclass(frozen=True, slots=True)
class WatchEvents:
    """A batch of events from one watched prefix."""

    prefix: str
    events: tuple[Event, ...]
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class WatchError:
    """A watch ended: the store went away, or history was compacted."""

    prefix: str
    error: AllocatorError
    epoch: int = 0


Message = WatchEvents | WatchError


class Sink(Protocol):
    """Where a watch puts its messages: the link's queue (which takes other messages too)."""

    def put(self, item: Message, /) -> None:
        """Hand over one message; never blocks (the queue is unbounded)."""


class WatchThread:
    """Watch one prefix from a revision in a daemon thread, feeding ``inbox``."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        prefix: str,
        start_revision: int,
        inbox: Sink,
        poll_seconds: float = 1.0,
        epoch: int = 0,
    ) -> None:
        self._open_store = open_store
        self.prefix = prefix
        self._start = start_revision
        self._inbox = inbox
        self._poll = poll_seconds
        self.epoch = epoch
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
                        self._inbox.put(WatchEvents(self.prefix, tuple(events), self.epoch))
            finally:
                watch.close()
        except AllocatorError as exc:  # unavailable, compacted, permission: the link decides
            if not self._stopping.is_set():
                self._inbox.put(WatchError(self.prefix, exc, self.epoch))
        finally:
            if store is not None:
                store.close()


def start_watches(
    open_store: Callable[[], Store],
    prefixes: Sequence[str],
    start_revision: int,
    inbox: Sink,
    epoch: int = 0,
) -> list[WatchThread]:
    """Start one :class:`WatchThread` per prefix."""
    threads = [WatchThread(open_store, p, start_revision, inbox, epoch=epoch) for p in prefixes]
    for thread in threads:
        thread.start()
    return threads
