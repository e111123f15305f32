"""A job across two hosts that frees its GPUs when it finishes: released whole, never early.

node1's share ends (exit 0) well before node2's. The release waits until
every share has finished, so node2's workers end by themselves (exit 0),
never stopped by a release; then one agent releases the whole job. Two
agents on this machine, one store (SQLite and a real etcd).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import AgentHarness, hosts_of
from tests.support.waiting import wait_for

# node1's share ends at once, node2's after a while: a rank still finishing its work.
LATE = "import os, time; time.sleep(0.1 if os.environ['ALLOCATOR_HOST'] == 'node1' else 3)"


@pytest.fixture
def hosts(tmp_path: Path, store_url: str, prefix: str) -> Iterator[list[AgentHarness]]:
    marker = str(tmp_path)  # in the command line, so cleanup finds the workers
    policy = {
        "version": 1,
        "hosts": {"node1": {"gpus": 2}, "node2": {"gpus": 2}},
        "jobs": {
            "ddp": {
                "command": [sys.executable, "-c", LATE, marker],
                "release_on_exit": True,
                "grace_seconds": 1,
            }
        },
        "health": {"interval_seconds": 0.2},
    }
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        agents = list(named.values())
        agents[0].apply_policy(policy)
        for agent in agents:
            agent.start_agent("--master-addr", "127.0.0.1")
        yield agents


def _state(agent: AgentHarness) -> str | None:
    record = agent.worker_record("ddp")
    return record.state if record is not None else None


def test_a_finished_share_waits_for_the_others_then_the_job_is_released_whole(
    hosts: list[AgentHarness],
) -> None:
    node1, node2 = hosts
    assert node1.cli("set", "job=ddp", "host=node1,node2", "gpus=0").code == 0
    wait_for("node1's share to finish", lambda: _state(node1) == "finished")
    assert node1.cli("get", "job=ddp").code == 0  # node2's share still runs: nothing released
    wait_for("the whole job's release", lambda: node1.cli("get", "job=ddp").code == 6, 30)
    exits = node2.events("worker-exited", job="ddp")
    assert [(e["exit_code"], e["crash"]) for e in exits] == [(0, False)]  # ended by itself
    assert not node2.events("stopping", job="ddp")
    result = node1.cli("history", "job=ddp", "-o", "json")
    releases = [e for e in json.loads(result.out)["entries"] if e["action"] == "release"]
    assert releases and "finished (exit 0)" in releases[0]["reason"]
