"""A real agent on an etcd with authentication: its credentials reach no worker and no log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import AgentHarness
from tests.support.etcd_server import EtcdServer

TOKEN = "consul-token-5150"


@pytest.fixture
def secured(tmp_path: Path, prefix: str) -> Iterator[tuple[AgentHarness, str]]:
    """An agent whose store URL carries etcd's root password, and every other credential."""
    server = EtcdServer(tmp_path / "etcd", auth=True)
    server.start()
    password = server.root_password
    harness = AgentHarness(tmp_path, f"etcd://root:{password}@{server.endpoint}", prefix)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    harness.env.update(
        ETCDCTL_USER=f"root:{password}",
        ETCDCTL_PASSWORD=password,
        ETCDCTL_ENDPOINTS=server.endpoint,
        ETCD_PASSWORD=password,
        CONSUL_HTTP_TOKEN=TOKEN,
        CONSUL_HTTP_TOKEN_FILE=str(token_file),
        CONSUL_HTTP_AUTH=f"ops:{password}",
        CONSUL_CLIENT_CERT="/etc/consul/client.pem",
        CONSUL_CLIENT_KEY="/etc/consul/client-key.pem",
        CONSUL_CACERT="/etc/consul/ca.pem",
        JOB_SIDE_URL=f"https://root:{password}@example.invalid/",
        KEEP_ME="a job may need this",
    )
    try:
        harness.apply_policy()
        harness.start_agent()
        yield harness, password
    finally:
        harness.cleanup()
        server.stop()


def test_workers_never_inherit_store_credentials_and_logs_never_show_them(
    secured: tuple[AgentHarness, str],
) -> None:
    world, password = secured
    assert world.cli("set", "job=train", "gpus=1").code == 0

    env = world.new_report("train")["env"]

    leaked = sorted(
        name
        for name, value in env.items()
        if name.startswith(("ETCDCTL_", "ETCD_", "ALLOCATOR_STORE", "CONSUL_"))
        or password in value
        or TOKEN in value
    )
    assert leaked == []
    assert env["KEEP_ME"] == "a job may need this"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-")  # the worker's own variables stay
    log = world.log_text()
    assert "store-connected" in log and password not in log
    assert "root:***@" in log  # the URL is still there to read, masked
