"""A job across two hosts that frees its GPUs when it finishes: released whole, never early.

node1's share ends (exit 0) well before node2's. The release waits until
every share has finished, so node2's workers end by themselves (exit 0),
never stopped by a release; then one agent releases the whole job. Two
agents on this machine, one store (SQLite and a real etcd).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.types import WorkerRecord
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


# node1's share ends at once; node2's crashes (exit 1) on its first run, and its
# second run (the crash restart) exits 0. argv[1]: this test's directory.
CRASH_ONCE = """
import os, pathlib, sys, time
if os.environ['ALLOCATOR_HOST'] == 'node1':
    sys.exit(0)
crashed = pathlib.Path(sys.argv[1]) / 'node2-crashed'
time.sleep(1)
if not crashed.exists():
    crashed.touch()
    sys.exit(1)
"""
# node2's share crashes (exit 1) once node1's has finished; restart: never.
CRASH_LAST = "import os, sys, time; time.sleep(0 if os.environ['ALLOCATOR_HOST'] == 'node1' else 1)"
CRASH_LAST += "; sys.exit(0 if os.environ['ALLOCATOR_HOST'] == 'node1' else 1)"


def _two_hosts(tmp_path: Path, code: str, **job: object) -> dict[str, Any]:
    return {
        "version": 1,
        "hosts": {"node1": {"gpus": 2}, "node2": {"gpus": 2}},
        "jobs": {
            "ddp": {
                "command": [sys.executable, "-c", code, str(tmp_path)],
                "release_on_exit": True,
                "grace_seconds": 1,
                "restart_backoff_seconds": 0.2,
                **job,
            }
        },
        "health": {"interval_seconds": 0.2},
    }


def _failed_entries(agent: AgentHarness) -> list[dict[str, Any]]:
    history = json.loads(agent.cli("history", "job=ddp", "-o", "json").out)["entries"]
    return [e for e in history if e["action"] == "failed"]


def _record(agent: AgentHarness) -> WorkerRecord | None:
    return agent.worker_record("ddp")


def test_a_crash_in_one_share_is_retried_before_the_whole_job_is_released(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        node1, node2 = named.values()
        node1.apply_policy(_two_hosts(tmp_path, CRASH_ONCE))
        for agent in (node1, node2):
            agent.start_agent("--master-addr", "127.0.0.1")
        assert node1.cli("set", "job=ddp", "host=node1,node2", "gpus=0").code == 0
        wait_for("the whole job's release", lambda: node1.cli("get", "job=ddp").code == 6, 30)
        exits = node2.events("worker-exited", job="ddp")
        assert [(e["exit_code"], e["crash"]) for e in exits] == [(1, True), (0, False)]
        result = node1.cli("history", "job=ddp", "-o", "json")
        releases = [e for e in json.loads(result.out)["entries"] if e["action"] == "release"]
        assert releases and "node2's share finished after 1 crash restart" in releases[0]["reason"]


def test_a_share_ending_in_a_crash_is_the_jobs_result_and_keeps_its_gpus(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        node1, node2 = named.values()
        node1.apply_policy(_two_hosts(tmp_path, CRASH_LAST, restart="never"))
        for agent in (node1, node2):
            agent.start_agent("--master-addr", "127.0.0.1")
        assert node1.cli("set", "job=ddp", "host=node1,node2", "gpus=0").code == 0
        wait_for("node2's share to end", lambda: (r := _record(node2)) and r.last_exit == 1)
        kept = wait_for(
            "node1's share to tell the job's result",
            lambda: (r := _record(node1)) and "node2's share ended with exit 1" in r.message and r,
        )
        assert "released" not in kept.message
        assert node1.cli("get", "job=ddp").code == 0  # not released: exit 1 is not a release
        status = node1.cli("status")
        assert "node2's share ended with exit 1" in status.out, status.out
        failed = wait_for("the job's result in its history", lambda: _failed_entries(node1))
        assert [(e["host"], e["by"]) for e in failed] == [("node1", "agent@node1")]
        assert "node2's share ended with exit 1" in failed[0]["reason"]


LINGER = "import os, time; time.sleep(0 if os.environ['ALLOCATOR_HOST'] == 'node1' else 300)"
#: The agents' lease (etcd grants 2 s at the least); a dead agent's record is gone this
#: long after it died, and a finished share waits as long again (an agent restarting).
LEASE_TTL_S = 2.0


def test_a_dead_peers_share_is_judged_by_its_agents_liveness(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    settings = tmp_path / "agent.yaml"
    settings.write_text(f"lease_ttl: {LEASE_TTL_S}\nheartbeat_seconds: 0.5\n")
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        node1, node2 = named.values()
        node1.apply_policy(_two_hosts(tmp_path, LINGER))
        for agent in (node1, node2):
            agent.start_agent("--master-addr", "127.0.0.1", "--config", str(settings))
        assert node1.cli("set", "job=ddp", "host=node1,node2", "gpus=0").code == 0
        waiting = wait_for(
            "node1's share to finish and wait for node2's",
            lambda: (r := _record(node1)) and r.state == "finished" and "node2" in r.message and r,
        )
        assert "released" not in waiting.message  # the job's GPUs are all still held
        node2.stop_agent(signal.SIGKILL)  # a dead agent: its record's lease runs out
        started = time.monotonic()
        wait_for("the whole job's release", lambda: node1.cli("get", "job=ddp").code == 6, 30)
        assert time.monotonic() - started < 2 * LEASE_TTL_S + 10  # the bound in docs/agent.md
        result = node1.cli("history", "job=ddp", "-o", "json")
        releases = [e for e in json.loads(result.out)["entries"] if e["action"] == "release"]
        assert releases and "node2's agent is gone" in releases[0]["reason"]
