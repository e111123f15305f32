"""A store outage never stops a worker; the agent catches up when the store returns."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness, pid_alive
from tests.support.waiting import wait_for


@pytest.fixture
def outage_world(tmp_path: Path, etcd_server_private: Any, prefix: str) -> Iterator[AgentHarness]:
    """An agent on its own etcd, which the test stops and starts."""
    # A short backoff cap keeps the test quick (the default is 4 s).
    settings = tmp_path / "agent.yaml"
    settings.write_text("retry_max_seconds: 1\n")
    harness = AgentHarness(tmp_path, etcd_server_private.url, prefix)
    with harness.running("--config", str(settings)):
        yield harness


def test_etcd_down_keeps_workers_and_changes_after_it_returns_apply(
    outage_world: AgentHarness, etcd_server_private: Any
) -> None:
    world = outage_world
    assert world.cli("set", "job=train", "gpus=0").code == 0
    first = world.new_report("train")

    etcd_server_private.stop()
    wait_for("the agent to notice the outage", lambda: world.events("store-unavailable"))
    # Several seconds of outage: the agent keeps retrying (jittered backoff) and the
    # worker keeps running on the last known assignment the whole time.
    wait_for("a few retries", lambda: len(world.events("store-unavailable")) >= 3, timeout=30)
    assert pid_alive(first["pid"])
    assert world.report("train") == first

    etcd_server_private.restart()  # same ports, same data
    wait_for("the agent to reconnect", lambda: world.events("store-connected")[1:], timeout=60)
    assert pid_alive(first["pid"]) and world.report("train") == first

    assert world.cli("set", "job=train", "gpus=2").code == 0
    moved = world.new_report("train", not_pid=first["pid"], timeout=20)
    assert moved["env"]["ALLOCATOR_GPUS"] == "2"
    assert not pid_alive(first["pid"])


def test_etcd_down_while_a_worker_crashes_restarts_it_from_the_last_known_assignment(
    outage_world: AgentHarness, etcd_server_private: Any
) -> None:
    world = outage_world
    assert world.cli("set", "job=train", "gpus=1").code == 0
    first = world.new_report("train")
    etcd_server_private.stop()
    wait_for("the agent to notice the outage", lambda: world.events("store-unavailable"))
    os.kill(first["pid"], signal.SIGKILL)
    again = world.new_report("train", not_pid=first["pid"], timeout=20)
    assert again["env"]["ALLOCATOR_GPUS"] == "1"


#: The agent's promise for a hung store: the next heartbeat plus one call's deadline.
HEARTBEAT_S, CALL_S = 2.0, 1.0
#: Slack for a loaded machine, on top of the promise (a hang guard, not the figure tested).
SLACK_S = 5.0


def test_a_hung_etcd_is_noticed_by_the_keep_alive_deadline_and_kills_no_worker(
    tmp_path: Path, etcd_server_private: Any, prefix: str
) -> None:
    # SIGSTOP, not a crash: connections stay open and the watches merely go quiet,
    # so only a call's deadline can tell. The agent must say so, keep its worker,
    # and pick up what changed once etcd answers again.
    settings = tmp_path / "agent.yaml"
    settings.write_text(f"retry_max_seconds: 1\nheartbeat_seconds: {HEARTBEAT_S}\n")
    world = AgentHarness(tmp_path, f"{etcd_server_private.url}?timeout={CALL_S}", prefix)
    with world.running("--config", str(settings)):
        assert world.cli("set", "job=train", "gpus=0").code == 0
        first = world.new_report("train")
        os.kill(etcd_server_private.pid, signal.SIGSTOP)
        try:
            wait_for(
                "the agent to notice the hang",
                lambda: world.events("store-unavailable"),
                timeout=HEARTBEAT_S + CALL_S + SLACK_S,
            )
            assert pid_alive(first["pid"]) and world.report("train") == first
        finally:
            os.kill(etcd_server_private.pid, signal.SIGCONT)
        wait_for("the agent to reconnect", lambda: world.events("store-connected")[1:], timeout=30)
        assert pid_alive(first["pid"]) and world.report("train") == first
        assert world.cli("set", "job=train", "gpus=2").code == 0
        moved = world.new_report("train", not_pid=first["pid"], timeout=20)
        assert moved["env"]["ALLOCATOR_GPUS"] == "2"
