"""`make demo` runs `allocator demo`: it must keep working and leave nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.e2e.agent_harness import processes_running
from tests.e2e.conftest import EXAMPLE_POLICY


def test_demo_shows_the_tour_and_leaves_nothing_behind() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCATOR_", "CUDA_"))}
    result = subprocess.run(
        [sys.executable, "-m", "allocator", "demo", "--policy", str(EXAMPLE_POLICY)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out, err = result.stdout, result.stderr
    assert "GPU 1 on node1 is held by job 'train'" in err  # the refused double-booking
    assert "reserved by 'nightly-eval'" in err  # the refused reservation
    assert "CUDA_VISIBLE_DEVICES='1,3'" in out and "CUDA_VISIBLE_DEVICES='2'" in out
    assert "on CPU (GPU 2 unhealthy: XID 79" in out
    assert "worker stopped" in out
    # It ends with the tour's history: the operator's changes and the agent's decisions.
    tail = out[out.rindex("$ allocator history") :].splitlines()
    actions = [line.split()[3] for line in tail[2:] if line.startswith("20")]
    assert actions == ["release", "recover", "fallback", "move", "set", "policy-apply"]
    assert tail[-1] == "# done: the temporary store is gone"
    store = re.search(r"a temporary store: sqlite://(\S+)", out)
    assert store is not None and not os.path.exists(store.group(1))
    assert list(processes_running("worker pid")) == []
