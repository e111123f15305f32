"""The ``release_on_exit`` field of a job: ``true``, ``false`` or a list of exit statuses.

When every worker of the job has ended by itself with one of these statuses
the agent releases the job's GPUs (``true`` is ``[0]``: a job that finished).
A status is what the agent records: the worker's own exit code (0-255), or
128+N when signal N ended it (up to 128+64). The model keeps the statuses as
a sorted tuple; ``()`` is ``false``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocator.policy.yamlspec.kinds import Bool, Int
from allocator.policy.yamlspec.reader import INVALID, Reader, kind_of
from allocator.policy.yamlspec.structures import ListOf

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = ["DEFAULT_RELEASE_STATUSES", "MAX_EXIT_STATUS", "ReleaseOnExit"]

#: What ``release_on_exit: true`` means: the job finished (every worker exited 0).
DEFAULT_RELEASE_STATUSES = (0,)
#: The highest status a worker can end with: 128 + the last real-time signal.
MAX_EXIT_STATUS = 128 + 64
_STATUS = Int(minimum=0, maximum=MAX_EXIT_STATUS, why="128 + the highest signal number")
_STATUSES = ListOf(
    _STATUS, min_items=1, max_items=MAX_EXIT_STATUS + 1, unique=True, label="exit status"
)


class ReleaseOnExit:
    """Reads, describes and writes a job's ``release_on_exit`` statuses."""

    def read(self, node: Node, path: str, r: Reader) -> Any:
        """A sorted tuple of statuses from a boolean or a list, or ``INVALID``."""
        if kind_of(node) == "sequence":
            statuses = _STATUSES.read(node, path, r)
            return INVALID if statuses is INVALID else tuple(sorted(statuses))
        flag = Bool().read(node, path, r)
        if flag is INVALID:
            return INVALID
        return DEFAULT_RELEASE_STATUSES if flag else ()

    def schema(self) -> dict[str, Any]:
        """A boolean, or a list of exit statuses."""
        return {"anyOf": [Bool().schema(), _STATUSES.schema()]}

    def dump(self, value: Any) -> Any:
        """``false``, ``true`` (exit 0 only) or the list."""
        statuses = tuple(value)
        if not statuses:
            return False
        return True if statuses == DEFAULT_RELEASE_STATUSES else list(statuses)
