"""Where the store link is: one record per phase, each with the timer it waits on.

The link is in exactly one of these at a time, and only the link's thread
moves it. A store handle exists only in the phases that hold one, so a read,
a publish or a keep-alive without a connection cannot be written.

::

    Connecting --open--> Resyncing --read--> Watching <--read--> Refused
        ^                                    |    ^                |
        +-- failure (never connected)        |    +----read--------+
                                             v
    Outage(since) <------ failure while connected (or reconnecting after one)

and any of them --close--> Stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from allocator.store import Store

__all__ = [
    "Connected",
    "Connecting",
    "LinkPhase",
    "Outage",
    "Refused",
    "Resyncing",
    "Stopped",
    "Watching",
    "read_due_now",
    "with_store",
]

#: A full re-read asked for now (a watch event, SIGHUP, a compacted watch).
_NOW = float("-inf")


@dataclass(frozen=True, slots=True)
class Connecting:
    """No connection has been made yet: the next try is at ``retry_at`` (monotonic)."""

    retry_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Resyncing:
    """The store is open and its lease kept; the first full read since opening it runs.

    ``lost_since``: when the connection before it was lost (None: the first one).
    """

    store: Store
    lost_since: float | None = None


@dataclass(frozen=True, slots=True)
class Watching:
    """Connected and read: watches run, and the next full re-read is due at ``read_at``."""

    store: Store
    read_at: float


@dataclass(frozen=True, slots=True)
class Refused:
    """Connected and the lease kept, but reads are refused: the record says it is stale.

    ``read_at``: the next try, at the retry cap. ``own_read``: the agent's own
    keys were read since connecting (before the refusal), so its worker
    records are still published.
    """

    store: Store
    read_at: float
    own_read: bool


@dataclass(frozen=True, slots=True)
class Outage:
    """The connection was lost at ``since``; the next try is at ``retry_at``."""

    since: float
    retry_at: float


@dataclass(frozen=True, slots=True)
class Stopped:
    """Closed: withdrawn (or given up on), and no store is held."""


LinkPhase = Connecting | Resyncing | Watching | Refused | Outage | Stopped

#: The phases after a connection's first read: the link is up.
Connected = Watching | Refused


def with_store(phase: LinkPhase) -> Store | None:
    """The store handle ``phase`` holds, if any."""
    return phase.store if isinstance(phase, Resyncing | Watching | Refused) else None


def read_due_now(phase: LinkPhase) -> LinkPhase:
    """``phase`` with a full re-read due at once; a link that is not up reads on connecting."""
    return replace(phase, read_at=_NOW) if isinstance(phase, Watching | Refused) else phase
