"""A host removed from the policy: its agent stops its jobs and says why; no `set` lands there.

The policy is applied without the host over its assignment (``--force``):
the assignment stays in the store (an operator releases it), but nothing
the policy does not name runs or is placed there. On SQLite and a real etcd.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy, pid_alive
from tests.support.waiting import wait_for


def _without_this_host(world: AgentHarness) -> str:
    """Apply the policy without this host; return its digest as the apply printed it."""
    policy = agent_policy(world.workdir)
    policy["hosts"] = {"node2": {"gpus": 4}}
    path = world.workdir / "without.yaml"
    path.write_text(json.dumps(policy))
    applied = world.cli("policy", "apply", "--force", str(path))
    assert applied.code == 0, applied.err
    return applied.out.split("sha256 ")[1][:12]


def test_a_removed_hosts_agent_stops_its_jobs_and_set_there_is_refused(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    world = AgentHarness(tmp_path, store_url, prefix)
    with world.running():
        assert world.cli("set", "job=train", "gpus=0").code == 0
        first = world.new_report("train")
        digest = _without_this_host(world)

        stopped = wait_for(
            "the agent to stop train",
            lambda: (r := world.worker_record("train")) and r.state == "refused" and r,
        )
        assert f"host '{HOST}' is not in the applied policy" in stopped.message
        wait_for("train's worker to end", lambda: not pid_alive(first["pid"]))
        assert world.events("host-not-in-policy")
        assert world.events("policy")[-1]["sha256"] == digest  # the policy now in force

        for job in ("train", "waiter"):  # an existing job there, and a new one
            refused = world.cli("set", f"job={job}", f"host={HOST}", "gpus=1")
            assert refused.code == 2, (refused.code, refused.err)
            assert refused.err.count("\n") == 1 and "not in the policy" in refused.err
        shown = world.cli("get", "job=train")
        assert shown.code == 0 and shown.out.startswith(f"train@{HOST}: gpus 0")  # unchanged
