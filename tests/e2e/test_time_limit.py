"""Time limits kept by the agent, on SQLite and a real etcd (real agent, fake GPUs).

``set time=`` and ``submit time=`` end a job that ignores SIGTERM at its limit:
SIGTERM, the job's grace, SIGKILL of its whole tree; the GPUs are free again
and history says ``time limit``. The pool's ``default_time`` limits a job that
asks for none, and a ``time=`` above the pool's ``max_time`` is refused;
``allocator.lease(time=)`` releases at its limit and tells the block.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy, pid_alive
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

#: A command that ignores SIGTERM, as does its child: only SIGKILL ends them.
STUBBORN = 'trap "" TERM; sleep 60 & wait; wait'


def limited_policy(workdir: Path) -> dict[str, Any]:
    """Two GPUs in a pool with a 1h default and a 2h maximum."""
    policy = agent_policy(workdir, gpus=2)
    policy["pools"] = {"gpu": {"hosts": [HOST], "default_time": "1h", "max_time": "2h"}}
    if os.geteuid() == 0:
        policy["submit_as_root"] = ["root"]
    return policy


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix, gpus=2)
    with harness.running(policy=limited_policy(tmp_path)):
        yield harness


def _holding(world: AgentHarness, job: str) -> dict[str, Any] | None:
    result = world.cli("get", f"job={job}", "-o", "json")
    assert result.code in (0, 6), result.err
    return json.loads(result.out) if result.code == 0 else None


def _reasons(world: AgentHarness, job: str) -> list[str]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    return [e.get("reason", "") for e in json.loads(result.out)["entries"]]


@pytest.mark.slow
def test_set_time_ends_a_job_that_ignores_sigterm(world: AgentHarness) -> None:
    assert world.cli("set", "job=stubborn", "gpus=0", "time=2s").code == 0
    report = world.new_report("stubborn")
    assert pid_alive(report["child_pid"])

    # The limit (2s), the job's grace (1s), then SIGKILL: well within the deadline.
    wait_for("the release at the limit", lambda: _holding(world, "stubborn") is None, timeout=15)
    wait_for("the worker to die", lambda: not pid_alive(report["pid"]), timeout=10)
    wait_for("its child to die", lambda: not pid_alive(report["child_pid"]), timeout=10)
    assert "time limit" in _reasons(world, "stubborn")
    assert world.cli("set", "job=next", "gpus=0").code == 0  # the GPU is free again


@pytest.mark.slow
def test_submit_time_ends_a_job_that_ignores_sigterm(world: AgentHarness) -> None:
    result = world.cli(
        "submit", "job=batch", "gpus=1", f"host={HOST}", "time=2s", "--", "sh", "-c", STUBBORN
    )
    assert result.code == 0, result.err
    held = wait_for("the job to start", lambda: _holding(world, "batch"), timeout=30)
    assert held["ends_at"]

    # The limit (2s), the default grace of an undeclared job (10s), then SIGKILL.
    wait_for("the release at the limit", lambda: _holding(world, "batch") is None, timeout=30)
    assert any(r.startswith("time limit (exit ") for r in _reasons(world, "batch"))
    assert world.events("batch-time-limit", job="batch", signal="SIGKILL")
    assert world.cli("set", "job=next", "gpus=1").code == 0


def test_the_pools_default_and_maximum_apply_to_set(world: AgentHarness) -> None:
    assert world.cli("set", "job=plain", "gpus=0").code == 0
    held = _holding(world, "plain")
    assert held is not None and held["ends_at"]
    hour = r"(59m\d\ds|1h00m)"  # the pool's 1h, less what passed since the set
    assert re.search(rf"ends {held['ends_at']} \({hour} left\)", world.cli("get", "job=plain").out)
    table = world.cli("status").out.splitlines()
    assert table[0].split()[-2:] == ["TIME", "LEFT"]
    assert re.fullmatch(hour, table[1].split()[-1])
    host = json.loads(world.cli("status", "-o", "json").out)["hosts"][0]
    assert [j["ends_at"] for j in host["jobs"]] == [held["ends_at"]]

    refused = world.cli("set", "job=long", "gpus=1", "time=3h")
    assert refused.code == 2
    assert refused.err.strip().splitlines() == [
        "allocator: error: time=3h is above the maximum of pool gpu: 2h"
    ]
    assert _holding(world, "long") is None


def test_status_has_no_time_column_while_no_holding_has_a_limit(
    tmp_path: Path, store_url: str, prefix: str
) -> None:
    harness = AgentHarness(tmp_path, store_url, prefix, gpus=2)
    with harness.running(start=False):
        assert harness.cli("set", "job=free", "gpus=0").code == 0
        assert "TIME LEFT" not in harness.cli("status").out
        assert harness.cli("set", "job=timed", "gpus=1", "time=1h").code == 0
        assert "TIME LEFT" in harness.cli("status").out


LEASE = """
import time
import allocator
from allocator.errors import LeaseLost
try:
    with allocator.lease(count=1, host="node1", job="notebook", time="2s"):
        print("held", flush=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # a training loop
            time.sleep(0.02)
        print("went on", flush=True)
except LeaseLost as exc:
    print("raised:", exc, flush=True)
"""


def test_a_lease_ends_at_its_time_limit(applied: Cli, cli_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LEASE], env=cli_env, capture_output=True, text=True, timeout=30
    )
    lost = "raised: the GPUs' hold was lost: its time limit was reached"
    # A loaded machine may reach the limit before the block begins: it raises all the same.
    assert done.stdout.splitlines()[-1:] == [lost], (done.stdout, done.stderr)
    assert applied("get", "job=notebook").code == 6
    assert "time limit" in applied("history", "job=notebook").out
