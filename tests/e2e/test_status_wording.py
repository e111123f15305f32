"""What `allocator status` says about agents, as a reader takes it: the CLI as a process.

The agents' records are written into the store as an agent writes them (the one that is
alive under a lease), so each state is the one a real fleet shows.
"""

from __future__ import annotations

from pathlib import Path

from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, WorkerRecord
from allocator.store import Store
from tests.e2e.conftest import Cli

POLICY = """\
version: 1
hosts:
  node1: {gpus: 2}
  node2: {gpus: 2}
"""


def _line(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_status_says_what_it_knows_of_each_agent(
    cli: Cli, store: Store, prefix: str, tmp_path: Path
) -> None:
    layout = KeyLayout(prefix)
    (tmp_path / "policy.yaml").write_text(POLICY)
    assert cli("policy", "apply", str(tmp_path / "policy.yaml")).code == 0
    assert cli("set", "job=train", "gpus=0", "host=node1").code == 0
    assert cli("set", "job=eval", "count=1", "host=node2").code == 0  # count=N: it says why
    # node1's agent died with its worker running: its record is gone, the worker's stays.
    worker = WorkerRecord(job="train", host="node1", state="running", pids=(4242,), gpus=(0,))
    store.put(layout.workers("node1", "train"), worker.to_json())
    # node2's agent lives but no GPU library answered: its GPUs are the policy's count.
    lease = store.grant_lease(60)
    agent = AgentRecord(
        host="node2", gpus=(GpuInfo(0), GpuInfo(1)), inventory_source="declared", vendor="nvidia"
    )
    store.put(layout.agent("node2"), agent.to_json(), lease=lease)
    try:
        shown = cli("status")
    finally:
        store.revoke_lease(lease)
    assert shown.code == 0, shown.err
    gone = _line(shown.out, "node1: agent")
    assert "train last reported running pid 4242" in gone, gone
    assert "in sync" not in gone, gone
    seen = _line(shown.out, "node2: agent")
    assert seen.startswith("node2: agent alive, GPUs not seen (no GPU library answered"), seen
    assert "nvidia GPUs" not in seen, seen
    assert " picked " not in shown.out, shown.out  # `set` said it; -o json keeps it
