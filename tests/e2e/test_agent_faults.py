"""Data the agent cannot use, and bugs in its own steps, never cost a running worker."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.types import Assignment
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.e2e.conftest import run_cli
from tests.support.waiting import wait_for

BUGGY_AGENT = Path(__file__).resolve().parents[1] / "support" / "buggy_agent.py"


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    """A policy applied and an agent running on SQLite (the behaviour is the store's, not)."""
    url = f"sqlite://{tmp_path / 'store.db'}"
    with AgentHarness(tmp_path, url, prefix).running(start=False) as harness:
        yield harness


def _assignment(job: str, gpus: list[int], **fields: Any) -> dict[str, Any]:
    return {
        "job": job,
        "host": HOST,
        "gpus": gpus,
        "mode": "gpu",
        "updated_by": "someone@x",
        "updated_at": "2026-01-01T00:00:00Z",
        "schema_version": 1,
        **fields,
    }


def _put_json(world: AgentHarness, key: str, body: Any) -> int:
    return world.put_raw(key, json.dumps(body).encode())


def _no_outage(world: AgentHarness) -> bool:
    problems = ("store-unavailable", "store-error", "link-error", "internal-error")
    return not any(world.events(event) for event in problems)


def test_malformed_records_are_skipped_and_every_other_job_keeps_running(
    world: AgentHarness,
) -> None:
    # The agent watches its share of the policy, not the record: a record written
    # by hand (behind the shares' head) is read at the next resync.
    settings = world.workdir / "agent.yaml"
    settings.write_text("resync_seconds: 1\n")
    world.start_agent("--config", str(settings))
    assert world.cli("set", "job=train", "gpus=0").code == 0
    train = world.new_report("train")
    jobs = world.layout.host_jobs(HOST)
    bad = {
        f"{jobs}ranks": _assignment(["ranks"], [1]),  # type: ignore[arg-type]
        f"{jobs}waiter": _assignment("waiter", "1"),  # type: ignore[arg-type]
        f"{jobs}crashy": _assignment("crashy", [2], mode="cpu", fallback_reason=7),
        f"{jobs}stubborn": _assignment("stubborn", [3], command=["sleep", 5]),
    }
    for key, body in bad.items():
        _put_json(world, key, body)
    status = world.cli("status", "-o", "json")
    assert status.code == 0, status.err
    (host,) = [h for h in json.loads(status.out)["hosts"] if h["host"] == HOST]
    assert len(host["bad_records"]) == len(bad)
    # A policy record without its hash: the agent keeps the policy it has.
    policy = world.layout.policy
    _put_json(world, policy, {"yaml": "version: 1\n", "applied_by": "x", "schema_version": 1})
    wait_for(
        "a bad-record line for each",
        lambda: {e["key"] for e in world.events("bad-record")} >= {*bad, policy},
    )
    assert world.process is not None and world.process.poll() is None
    assert world.report("train") == train and pid_alive(train["pid"])
    # Real changes still apply.
    world.apply_policy()  # the CLI needs a readable policy to check a request
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    world.new_report("waiter")
    assert world.report("train") == train and pid_alive(train["pid"])
    assert _no_outage(world)


def test_a_damaged_record_of_a_running_job_does_not_stop_it(world: AgentHarness) -> None:
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=0").code == 0
    train = world.new_report("train")
    key = world.layout.assignment(HOST, "train")
    revision = _put_json(world, key, _assignment("train", "0"))  # gpus a string
    wait_for(
        "the damage to be seen", lambda: world.events("bad-record", key=key, revision=revision)
    )
    # Level-based rounds after it (a change elsewhere) keep train on its last good assignment.
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    world.new_report("waiter")
    assert world.report("train") == train and pid_alive(train["pid"])
    assert not world.events("stop", job="train")
    # Repaired by hand, the record is followed again.
    _put_json(world, key, _assignment("train", [2]))
    moved = world.new_report("train", not_pid=train["pid"])
    assert moved["env"]["ALLOCATOR_GPUS"] == "2"


def test_an_agent_restarted_while_a_record_is_damaged_keeps_the_adopted_worker(
    world: AgentHarness,
) -> None:
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=0").code == 0
    train = world.new_report("train")
    world.stop_agent(signal.SIGKILL)  # its worker runs on, for the next agent to adopt
    key = world.layout.assignment(HOST, "train")
    revision = _put_json(world, key, _assignment("train", "0"))  # damaged while no agent ran
    world.start_agent()
    wait_for(
        "the damage to be seen", lambda: world.events("bad-record", key=key, revision=revision)
    )
    assert world.cli("set", "job=waiter", "gpus=1").code == 0  # rounds after it
    world.new_report("waiter")
    assert world.report("train") == train and pid_alive(train["pid"])
    assert not world.events("stop", job="train")


def test_keys_the_agent_cannot_handle_are_bad_records_not_outages(world: AgentHarness) -> None:
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=0").code == 0
    train = world.new_report("train")
    jobs = world.layout.host_jobs(HOST)
    odd = {
        f"{jobs}train\n": _assignment("train\n", [1]),  # "$" matches before a final newline
        f"{jobs}zz/train": _assignment("train", [2]),  # a second key for train, one level down
        f"{jobs}bad name!": _assignment("bad name!", [3]),
    }
    for key, body in odd.items():
        _put_json(world, key, body)
    wait_for(
        "each odd key reported as a bad record",
        lambda: {e["key"] for e in world.events("bad-record")} >= set(odd),
    )
    # The link never dropped: a real change after them applies at once, train untouched.
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    world.new_report("waiter")
    assert world.report("train") == train and pid_alive(train["pid"])
    assert [e["cause"] for e in world.events("start", job="train")] == ["new"]
    record = world.worker_record("train")
    assert record is not None and record.gpus == (0,)
    assert _no_outage(world)


def test_a_bug_in_a_reconcile_step_is_logged_and_retried_without_touching_workers(
    world: AgentHarness,
) -> None:
    bug = world.workdir / "bug-present"
    world.start_agent(launcher=(str(BUGGY_AGENT),), env={"ALLOCATOR_TEST_BUG_FILE": str(bug)})
    assert world.cli("set", "job=train", "gpus=0").code == 0
    train = world.new_report("train")

    bug.touch()
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    errors = wait_for(
        "the bug to be logged", lambda: world.events("internal-error", step="reconcile")
    )
    assert "planted bug" in errors[0]["error"] and "Traceback" in errors[0]["traceback"]
    wait_for("a retry that fails again", lambda: len(world.events("internal-error")) >= 2)
    assert world.process is not None and world.process.poll() is None
    assert pid_alive(train["pid"]) and world.report("train") == train

    bug.unlink()  # the retry after the backoff now succeeds, and the change applies
    world.new_report("waiter", timeout=45)
    assert world.events("recovered", step="reconcile")
    assert pid_alive(train["pid"]) and world.report("train") == train
    assert Assignment  # the records module is importable by the planted launcher's run too


def test_a_malformed_store_url_is_refused_at_start_not_retried_forever(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}
    state = str(tmp_path / "agent")
    result = run_cli(
        ["agent", "--host", HOST, "--state-dir", state, "--store", "bogus://somewhere"],
        env,
        timeout=30,
    )
    assert result.code == 2
    assert result.err.count("\n") == 1 and "unknown store URL" in result.err
