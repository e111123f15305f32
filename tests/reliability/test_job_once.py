"""A job never runs twice: the agent is killed -9 and its state file is lost meanwhile.

The restarted agent then knows the job only from its shims' status files:
the revision of the assignment the worker ran under, and how it ended. A
job adopted that way and finishing later, or one that finished while no
agent ran, is finished, never started again under the same assignment.
A real agent on SQLite and on a real etcd, fake GPUs, real workers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import (
    AgentHarness,
    _job,
    agent_policy,
    pid_alive,
    processes_running,
    reap_like_init,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")


@pytest.fixture(params=["sqlite", "etcd"])
def world(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'store.db'}"
    else:
        url = str(request.getfixturevalue("etcd_server").url)
    world = AgentHarness(tmp_path, url, prefix)
    policy = agent_policy(tmp_path)
    policy["jobs"]["once"] = _job("once", tmp_path, "--exit-on-usr2", restart="never")
    policy["jobs"]["ranked"] = _job("ranked", tmp_path, "--spawn-child", "--setsid-child")
    try:
        world.apply_policy(policy)
        world.start_agent()
        yield world
    finally:
        world.cleanup()


def _starts(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    return [e for e in world.log_events() if e["event"] == "start" and e.get("job") == job]


def _running_then_kill_9(world: AgentHarness, job: str = "once") -> dict[str, Any]:
    """``job`` runs; the agent dies and its state file is cut short (a full disk, a crash)."""
    assert world.cli("set", f"job={job}", "gpus=0").code == 0
    report = world.new_report(job)
    world.stop_agent(signal.SIGKILL)
    state = world.workdir / "agent" / "workers.json"
    state.write_text(state.read_text()[:20])
    return report


def _finished(world: AgentHarness) -> bool:
    record = world.worker_record("once")
    return record is not None and record.state == "finished"


def _ran_once(world: AgentHarness) -> None:
    wait_for("the job to finish", lambda: _finished(world))
    # Another job started after it: the agent planned again since, and left `once` alone.
    assert world.cli("set", "job=train", "gpus=3").code == 0
    wait_for("a later job's start", lambda: _starts(world, "train"))
    assert len(_starts(world, "once")) == 1
    assert _finished(world)


def test_a_job_adopted_from_status_files_finishes_once(world: AgentHarness) -> None:
    report = _running_then_kill_9(world)
    world.start_agent()
    wait_for("adoption", lambda: world.events("adopt-from-status", job="once"))
    os.kill(report["pid"], signal.SIGUSR2)  # it ends by itself, exit 0, under the new agent
    _ran_once(world)


def test_a_job_that_finished_while_no_agent_ran_is_not_run_again(world: AgentHarness) -> None:
    report = _running_then_kill_9(world)
    os.kill(report["pid"], signal.SIGUSR2)  # its shim writes `exited 0` and ends
    reap_like_init([report["pid"], report["ppid"]])
    world.start_agent()
    _ran_once(world)


def test_a_rank_orphaned_while_no_agent_ran_is_stopped_before_the_job_starts_again(
    world: AgentHarness,
) -> None:
    child = world.workdir / "ranked.json.child"
    report = _running_then_kill_9(world, "ranked")  # the worker reports once its rank did
    rank = json.loads(child.read_text())["pid"]
    os.kill(report["ppid"], signal.SIGKILL)  # the shim: its worker dies with it, the rank not
    reap_like_init([report["ppid"], report["pid"]])
    assert pid_alive(rank)
    world.start_agent()
    wait_for("the job's new start", lambda: len(_starts(world, "ranked")) >= 2)
    assert not pid_alive(rank), "the job started again beside its orphaned rank"
    world.stop_agent()  # an orderly stop leaves nothing of the job behind
    assert list(processes_running(str(world.workdir / "ranked.json"))) == []
