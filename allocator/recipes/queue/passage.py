"""An operator's direct ``set`` that passes the queue: allowed, and said.

A plain ``set`` (no ``--wait``) is an operator's order: it takes free GPUs
whoever waits for them. It is never refused for the queue, but it does not
pass it silently either: :class:`Passage` is its gate, which compares
nothing and only notes the waiting requests that could have used the GPUs
it takes, for the change's history entry and the line ``set`` prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocator.control.gate import Passage
from allocator.recipes.queue.order import blockers, decode_queue
from allocator.recipes.queue.view import QuotaLook, able_gpus

if TYPE_CHECKING:
    from allocator.placement.choose import Placement
    from allocator.recipes.context import Context
    from allocator.status.snapshots import HostSnapshot

__all__ = ["QueuePass", "passed_line"]

#: The most waiting requests a history entry names (the count is always whole).
NAMED = 5


def passed_line(count: int, host: str) -> str:
    """What ``set`` says on stderr when it passed ``count`` waiting requests on ``host`` (pure)."""
    return f"passed {count} waiting request(s) on {host} (allocator queue host={host})"


class QueuePass:
    """The gate of an operator's direct ``set``: it lets every take through, counting who it passed.

    ``passed`` holds the waiting requests (job names) the last placement
    passed: the take that was written, when ``Allocator.assign`` returns.
    """

    def __init__(self, allocator: Context) -> None:
        self.allocator = allocator
        self.passed: list[str] = []
        self.host = ""

    def __call__(self, state: HostSnapshot, placed: Placement) -> Passage:
        self.passed, self.host = [], state.host
        if placed.mode != "gpu" or not placed.gpus:
            return Passage([], [])
        allocator = self.allocator
        queue = allocator.store.list(allocator.layout.host_queue(state.host))
        order = decode_queue(
            queue.items, allocator.on_bad_record, agent_alive=state.agent is not None
        )
        if not order:
            return Passage([], [])
        policy = allocator.require_policy().policy
        able = able_gpus(policy, state, allocator.clock())
        ahead = blockers(order, None, placed.gpus, able, QuotaLook(allocator, policy).over_quota)
        self.passed = [w.entry.job for w in ahead]
        return Passage([], [], self._remark())

    def _remark(self) -> str:
        """The history entry's words: how many it passed and (the first few of) whom."""
        if not self.passed:
            return ""
        named = ", ".join(self.passed[:NAMED]) + (", ..." if len(self.passed) > NAMED else "")
        return f"passed {len(self.passed)} waiting request(s) on {self.host}: {named}"
