"""The agent as a real process, handling processes the way production breaks them.

A worker's helper that moved to a session of its own, workers that end while
no agent runs, a job released and set again within its grace period, a job
naming a user the host does not know. The store is SQLite: what is tested
here does not depend on it.
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

from tests.e2e.agent_harness import DUMMY, AgentHarness, agent_policy, pid_alive, reap_like_init
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


def _dummy(workdir: Path, name: str, *extra: str, **fields: Any) -> dict[str, Any]:
    command = [sys.executable, str(DUMMY), "--out", str(workdir / f"{name}.json"), *extra]
    return {"command": command, "grace_seconds": 1, **fields}


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    policy = agent_policy(tmp_path)
    gpu0 = ("--lock", str(tmp_path / "gpu0.lock"))  # whoever runs on GPU 0 holds it
    escaping = ("--spawn-child", "--setsid-child", "--stubborn-child")
    crash_rules = {"restart_backoff_seconds": 0.1, "restart_backoff_max_seconds": 0.2}
    policy["jobs"].update(
        escaper=_dummy(tmp_path, "escaper", *gpu0, *escaping),
        successor=_dummy(tmp_path, "successor", *gpu0),
        done=_dummy(tmp_path, "done", "--exit-on-usr2"),
        bad=_dummy(tmp_path, "bad", "--exit-on-usr2", "--exit-code", "3", **crash_rules),
        tight=_dummy(tmp_path, "tight", "--ignore-sigterm", max_restarts=0),
        stranger=_dummy(tmp_path, "stranger", user="no-such-user-x", max_restarts=0),
    )
    with harness.running(policy=policy):
        yield harness


def _gone(pid: int) -> bool:
    """Whether nothing, not even a zombie, is left of ``pid``."""
    return not Path(f"/proc/{pid}").exists()


def test_a_helper_that_left_the_workers_session_is_gone_before_the_gpu_is_reused(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=escaper", "gpus=0").code == 0
    first = world.new_report("escaper")
    child = wait_for("the helper's report", lambda: _read(world, "escaper.json.child"))
    assert child["sid"] != first["sid"] and pid_alive(child["pid"])
    assert world.cli("release", "job=escaper").code == 0
    assert world.cli("set", "job=successor", "gpus=0").code == 0
    successor = world.new_report("successor", timeout=20)
    assert successor["lock_acquired_at_once"] is True  # nothing of escaper held GPU 0 any more
    assert _gone(child["pid"]) and _gone(first["pid"])  # killed, reaped: no zombie anywhere


def _read(world: AgentHarness, name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((world.workdir / name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def test_workers_that_end_while_the_agent_is_dead_keep_their_exit_codes(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=done", "gpus=1").code == 0
    assert world.cli("set", "job=bad", "gpus=2").code == 0
    done, bad = world.new_report("done"), world.new_report("bad")
    world.stop_agent(signal.SIGKILL)
    os.kill(done["pid"], signal.SIGUSR2)  # exits 0 ...
    os.kill(bad["pid"], signal.SIGUSR2)  # ... and 3, while no agent runs
    reap_like_init([done["pid"], done["ppid"], bad["pid"], bad["ppid"]])
    world.start_agent()
    restarted = world.new_report("bad", not_pid=bad["pid"])  # a crash: restarted by the rules
    record = wait_for("done's record", lambda: _state(world, "done", "finished"))
    assert record.last_exit == 0
    assert world.report("done") == done  # finished: never run again
    assert [e["cause"] for e in world.events("start", job="done")] == ["new"]
    assert [e["cause"] for e in world.events("start", job="bad")] == ["new", "crash"]
    assert world.events("worker-exited", job="bad", exit_code=3, crash=True)
    assert pid_alive(restarted["pid"])


def _state(world: AgentHarness, job: str, state: str) -> object:
    record = world.worker_record(job)
    return record if record is not None and record.state == state else None


def test_a_job_released_and_set_again_within_its_grace_is_not_a_crash(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=tight", "gpus=3").code == 0  # max_restarts: 0
    first = world.new_report("tight")
    assert world.cli("release", "job=tight").code == 0  # it ignores SIGTERM: 1 s of grace
    assert world.cli("set", "job=tight", "gpus=3").code == 0
    second = world.new_report("tight", not_pid=first["pid"])
    record = wait_for("the restarted record", lambda: _state(world, "tight", "running"))
    assert record.crash_restarts == 0
    assert not world.events("gave-up", job="tight")
    assert pid_alive(second["pid"]) and not pid_alive(first["pid"])


def test_a_user_the_host_does_not_know_is_shown_and_nothing_runs(world: AgentHarness) -> None:
    assert world.cli("set", "job=stranger", "gpus=0").code == 0
    record = wait_for("the refusal", lambda: _state(world, "stranger", "gave-up"))
    words = "job 'stranger': user 'no-such-user-x' does not exist on this host"
    assert words in record.message
    assert [e["error"] for e in world.events("worker-start-failed", job="stranger")] == [words]
    assert words in world.cli("status").out
    assert world.report("stranger") is None
