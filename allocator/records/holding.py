"""A holding's identity, as its processes carry it in their environment (pure).

``allocator run`` and ``allocator.lease()`` put :data:`HOLDING_VARIABLE`
into the environment of everything they start; whatever those processes
fork inherits it, whichever session or wrapper (``sh -c``, torchrun,
``setsid``) it ends up in. When the holding ends or its lease expires, the
host's agent stops every process whose environment carries it: a holding
ends only when nothing of it is left.

The identity names the key prefix (the store's namespace), the job, the
host and the holding process (its pid and start time, which together name
one process for a boot), so a later holding of the same job never matches
an earlier one's leftovers, nor another namespace's agent its holdings.
"""

from __future__ import annotations

from allocator.records.types import Assignment

__all__ = ["HOLDING_VARIABLE", "holding_identity", "submitted_words"]

#: The environment variable that names the holding a process belongs to.
HOLDING_VARIABLE = "ALLOCATOR_HOLDING"


def holding_identity(assignment: Assignment, prefix: str) -> str | None:
    """``<prefix>:<job>@<host>/<pid>.<start ticks>`` of a process-held assignment, else None."""
    holder = assignment.run
    if holder is None:
        return None
    ticks = "" if holder.start_ticks is None else str(holder.start_ticks)
    return f"{prefix}:{assignment.job}@{assignment.host}/{holder.pid}.{ticks}"


def submitted_words(assignment: Assignment) -> str:
    """A submitted job's holding in words: who submitted it, and that the agent runs it."""
    who = assignment.holder or "an unknown user"
    return f"submitted by {who} (job {assignment.job}, run by the agent on {assignment.host})"
