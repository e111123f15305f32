"""What the agent's loop wants published, handed to its store link: the latest, never a backlog."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from allocator.records.types import AgentRecord

__all__ = ["Outbox"]


class Outbox:
    """What the loop wants published; the link takes the latest, never a backlog."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agent: AgentRecord | None = None
        self._workers: dict[str, bytes] | None = None
        self._utilisation: int | None = None

    def offer(
        self, agent: AgentRecord, workers: Mapping[str, bytes] | None, utilisation: int | None
    ) -> bool:
        """Replace the content; return whether it differs from what was there."""
        new_workers = dict(workers) if workers is not None else None
        new = (agent, new_workers, utilisation)
        with self._lock:
            changed = new != (self._agent, self._workers, self._utilisation)
            self._agent, self._workers, self._utilisation = new
        return changed

    def take(self) -> tuple[AgentRecord | None, dict[str, bytes] | None, int | None]:
        """The latest content."""
        with self._lock:
            return self._agent, self._workers, self._utilisation
