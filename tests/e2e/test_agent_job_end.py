"""Jobs that end, with a real agent and real workers: ``release_on_exit`` and ``restart``.

A ``release_on_exit`` job that finishes gives its GPUs back through the
normal write path (its history entry says why) and is never started again;
``restart: never`` leaves a crashed job finished with its status;
``on-failure`` (the default) restarts a non-zero exit only. On SQLite and on
a real etcd.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness, _job, agent_policy
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix)
    policy = agent_policy(tmp_path)
    quick = {"restart_backoff_seconds": 0.1, "restart_backoff_max_seconds": 0.2}
    ends = {
        "done": _job("done", tmp_path, "--exit-after", "0.2", release_on_exit=True),
        "kept": _job("kept", tmp_path, "--exit-after", "0.2"),
        "once": _job("once", tmp_path, "--exit-after", "0.2", "--exit-code", "3", restart="never"),
        "again": _job("again", tmp_path, "--exit-after", "0.2", "--exit-code", "1", **quick),
        "long": _job("long", tmp_path, "--exit-after", "1.5"),
        "longdone": _job("longdone", tmp_path, "--exit-after", "1.5", release_on_exit=True),
    }
    policy["jobs"].update(ends)
    with harness.running(policy=policy):
        yield harness


def _starts(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    return [e for e in world.log_events() if e["event"] == "start" and e.get("job") == job]


def _state(world: AgentHarness, job: str, state: str) -> Any:
    record = world.worker_record(job)
    return record if record is not None and record.state == state else None


def test_a_release_on_exit_job_frees_its_gpus_when_it_finishes(world: AgentHarness) -> None:
    assert world.cli("set", "job=done", "gpus=1,2").code == 0
    wait_for("the finished job's release", lambda: world.cli("get", "job=done").code == 6)
    result = world.cli("history", "job=done", "-o", "json")
    assert result.code == 0, result.err
    entries = json.loads(result.out)["entries"]
    assert [e["action"] for e in entries] == ["release", "set"]  # newest first
    assert entries[0]["reason"] == "finished (exit 0); its GPUs released (release_on_exit)"
    assert entries[0]["by"] == "agent@node1"
    wait_for("the worker record to go", lambda: world.worker_record("done") is None)
    assert len(_starts(world, "done")) == 1  # never started again
    assert world.events("exit-released", job="done")
    # The GPUs are free: another job takes them at once.
    assert world.cli("set", "job=train", "gpus=1,2").code == 0


def test_restart_never_leaves_a_crashed_job_stopped_and_says_how_it_ended(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=once", "gpus=0").code == 0
    record = wait_for("the job to finish", lambda: _state(world, "once", "finished"))
    assert record.message == "finished (exit 3); restart: never" and record.last_exit == 3
    assert "finished (exit 3)" in world.cli("status").out
    assert "finished (exit 3); restart: never on node1" in world.cli("get", "job=once").out
    assert world.cli("get", "job=once").code == 0  # it keeps its GPUs: no release_on_exit
    assert len(_starts(world, "once")) == 1


def test_on_failure_restarts_a_non_zero_exit_only(world: AgentHarness) -> None:
    assert world.cli("set", "job=kept", "gpus=0").code == 0
    assert world.cli("set", "job=again", "gpus=1").code == 0
    wait_for("a crash restart", lambda: len(_starts(world, "again")) >= 2)
    assert {e["cause"] for e in _starts(world, "again")[1:]} == {"crash"}
    record = wait_for("the clean exit to finish", lambda: _state(world, "kept", "finished"))
    assert record.message == "finished (exit 0)"
    assert len(_starts(world, "kept")) == 1
    assert world.cli("get", "job=kept").code == 0  # kept its GPUs (no release_on_exit)


def _after_another_reconcile(world: AgentHarness) -> None:
    """Wait until the agent has planned again since now: a job set now has started."""
    assert world.cli("set", "job=kept", "gpus=3").code == 0
    wait_for("a later job's start", lambda: _starts(world, "kept"))


@pytest.mark.parametrize("again", [("gpus=0",), ("count=1",)])
def test_a_job_set_again_while_it_runs_runs_once(world: AgentHarness, again: tuple[str]) -> None:
    assert world.cli("set", "job=long", "gpus=0").code == 0
    wait_for("the job to run", lambda: _state(world, "long", "running"))
    assert world.cli("set", "job=long", *again).code == 0  # the same GPU: nothing to change
    wait_for("the job to finish", lambda: _state(world, "long", "finished"))
    _after_another_reconcile(world)
    assert len(_starts(world, "long")) == 1


def test_a_release_on_exit_job_set_again_while_it_runs_is_released_once(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=longdone", "gpus=1").code == 0
    wait_for("the job to run", lambda: _state(world, "longdone", "running"))
    assert world.cli("set", "job=longdone", "gpus=1").code == 0
    wait_for("the finished job's release", lambda: world.cli("get", "job=longdone").code == 6)
    _after_another_reconcile(world)
    assert len(_starts(world, "longdone")) == 1
    assert world.events("exit-released", job="longdone")
