"""What the loop and the store link say to each other: one small union each way.

Every message is frozen, and each side matches the union it receives
exhaustively (``assert_never``), so a new kind of message is a type error
wherever it is not handled yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.agent.config import AgentConfig
from allocator.agent.sync.host_records import HostView
from allocator.agent.sync.watches import WatchError, WatchEvents

__all__ = ["Close", "LinkState", "Settings", "ToLink", "ToLoop", "Wake"]


@dataclass(frozen=True, slots=True)
class LinkState:
    """The link came up or went down (the loop reports it to systemd)."""

    connected: bool
    detail: str = ""


#: To the loop: the newest read of the store, or the link's connection state.
ToLoop = HostView | LinkState


@dataclass(frozen=True, slots=True)
class Wake:
    """Something to publish, or (``resync``) a re-read to do."""

    resync: bool = False


@dataclass(frozen=True, slots=True)
class Settings:
    """Reloaded settings: the link takes their timing (the store, host and prefix stay)."""

    config: AgentConfig


@dataclass(frozen=True, slots=True)
class Close:
    """Withdraw and end the link (the worker records stay when ``keep_worker_records``)."""

    keep_worker_records: bool


#: To the link: from the loop (wake, settings, close) and from its watch threads.
ToLink = Wake | Settings | Close | WatchEvents | WatchError
