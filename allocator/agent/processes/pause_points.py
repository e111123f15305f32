"""Named points where a test can freeze the agent, to kill it at that exact moment.

``ALLOCATOR_TEST_PAUSE_AT=handover`` makes the agent stop for good in the
middle of handing a worker to its shim (half of the frame sent), say so on
stderr, and wait to be killed: the reliability suite kills it with SIGKILL
there and checks that the shim starts nothing. Unset (always, outside
tests), every point is a no-op. See docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["PAUSE_VARIABLE", "pause_point"]

PAUSE_VARIABLE = "ALLOCATOR_TEST_PAUSE_AT"


def pause_point(name: str) -> None:
    """Stop here for good when :data:`PAUSE_VARIABLE` names ``name`` (a test kills us)."""
    if os.environ.get(PAUSE_VARIABLE) != name:
        return
    sys.stderr.write(f"allocator-test: paused at {name}\n")
    sys.stderr.flush()
    while True:
        signal.pause()
