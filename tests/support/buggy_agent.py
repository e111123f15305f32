"""Run the real CLI with a bug planted in the agent's planner, for fault-containment tests.

While the file named by ``ALLOCATOR_TEST_BUG_FILE`` exists, every call of
``plan()`` from the agent's loop raises ``RuntimeError`` (the stand-in for a
bug no valid input can reach); once it is removed, planning works again.
Everything else is the real agent: real store, real workers, real signals.

    python tests/support/buggy_agent.py agent --host node1 ...
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import allocator.agent.daemon as loop
from allocator.cli import run

_real_plan = loop.plan
_bug_file = Path(os.environ["ALLOCATOR_TEST_BUG_FILE"])


def _buggy_plan(*args: Any, **kwargs: Any) -> Any:
    if _bug_file.exists():
        raise RuntimeError("planted bug: plan() failed")
    return _real_plan(*args, **kwargs)


loop.plan = _buggy_plan  # type: ignore[assignment]
run()
