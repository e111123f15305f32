"""Exit codes as the agent records them, and the words it says them in (pure).

A worker's exit code is its own, or 128+N when signal N ended it (what a
shell says); :data:`UNKNOWN_EXIT` when nobody could learn it (a worker
adopted after the agent's restart whose shim died with it).
"""

from __future__ import annotations

import contextlib
import signal

__all__ = ["UNKNOWN_EXIT", "describe_exit"]

#: The exit code of a worker whose end nobody saw.
UNKNOWN_EXIT = -1


def describe_exit(code: int) -> str:
    """Human words for an exit code: ``3``, ``143 (SIGTERM)``, ``unknown exit status``."""
    if code == UNKNOWN_EXIT:
        return "unknown exit status"
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)
