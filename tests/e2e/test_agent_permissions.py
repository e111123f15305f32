"""A refused permission is said plainly, retried slowly, and shown as a stale agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness
from tests.support.etcd_server import EtcdServer
from tests.support.waiting import wait_for

PASSWORD = "agent-secret"


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd with authentication on (root can do everything)."""
    server = EtcdServer(tmp_path / "etcd", auth=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _host_status(world: AgentHarness) -> dict[str, object]:
    result = world.cli("status", "-o", "json")
    assert result.code == 0, result.err
    (host,) = [h for h in json.loads(result.out)["hosts"] if h["host"] == HOST]
    return dict(host)


def test_an_agent_that_may_not_read_its_assignments_says_so_and_recovers(
    tmp_path: Path, prefix: str, auth_etcd: EtcdServer
) -> None:
    root_url = f"etcd://root:{auth_etcd.root_password}@{auth_etcd.endpoint}"
    world = AgentHarness(tmp_path, root_url, prefix)
    host = world.layout.host(HOST)
    # The agent's user may write its own keys, but was given no read of its assignments.
    auth_etcd.etcdctl("role", "add", "agent")
    for own in (world.layout.agent(HOST), world.layout.host_workers(HOST)):
        auth_etcd.etcdctl("role", "grant-permission", "agent", "--prefix=true", "readwrite", own)
    auth_etcd.etcdctl("user", "add", f"agent:{PASSWORD}")
    auth_etcd.etcdctl("user", "grant-role", "agent", "agent")
    settings = tmp_path / "agent.yaml"
    settings.write_text("retry_max_seconds: 1\n")
    agent_url = f"etcd://agent:{PASSWORD}@{auth_etcd.endpoint}"
    try:
        world.apply_policy()
        assert world.cli("set", "job=train", "gpus=0").code == 0
        world.start_agent("--config", str(settings), "--store", agent_url)
        refused = wait_for("the refusal", lambda: world.events("store-permission-denied"))
        assert "grant this agent read access" in refused[0]["hint"]
        assert wait_for("a stale agent", lambda: _host_status(world)["agent"] == "stale")
        assert world.report("train") is None
        assert not world.events("store-unavailable")  # not an outage: the link stays up

        auth_etcd.etcdctl("role", "grant-permission", "agent", "--prefix=true", "read", host)
        auth_etcd.etcdctl("role", "grant-permission", "agent", "read", world.layout.policy)
        world.new_report("train")  # retried at the cap, and now it reads
        assert wait_for("an alive agent", lambda: _host_status(world)["agent"] == "alive")
        assert world.events("store-readable")

        # Its role has no write of its counts key (status --summary's): said once, link kept.
        wait_for("the counts refused", lambda: world.events("counts-refused"))
        refusals = len(world.events("store-permission-denied"))
        first = world.report("train")
        assert first is not None and world.cli("set", "job=train", "gpus=1").code == 0
        world.new_report("train", not_pid=first["pid"])
        assert len(world.events("store-permission-denied")) == refusals
        assert len(world.events("counts-refused")) == 1
        # The policy key was granted alone, not as the prefix a watch needs: resyncs read it.
        policy = world.layout.policy
        assert wait_for("the refused watch", lambda: world.events("watch-refused", prefix=policy))
        assert len(world.events("store-permission-denied")) == refusals
    finally:
        world.cleanup()
