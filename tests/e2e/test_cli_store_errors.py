"""Store problems reach the operator as one line and the documented exit code."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from allocator.records.keys import KeyLayout
from bench.fleet import fleet_policy, host_name
from tests.e2e.conftest import EXAMPLE_POLICY, clean_env, run_cli
from tests.support.etcd_server import EtcdServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_etcd_exits_4_within_seconds_naming_the_endpoint() -> None:
    port = _free_port()
    started = time.monotonic()
    result = run_cli(["status"], clean_env(ALLOCATOR_STORE=f"etcd://127.0.0.1:{port}"))
    elapsed = time.monotonic() - started
    assert result.code == 4, (result.out, result.err)
    assert f"127.0.0.1:{port}" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert elapsed < 30  # a hang guard, not a timing assertion


def test_malformed_store_url_exits_2() -> None:
    for url in ("etcd://:abc", "nosuch://x", "etcd://127.0.0.1:99999"):
        result = run_cli(["status"], clean_env(ALLOCATOR_STORE=url))
        assert result.code == 2, (url, result.err)
        assert len(result.err.strip().splitlines()) == 1
        assert "Traceback" not in result.err


def test_missing_ca_file_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope-ca.pem"
    result = run_cli(
        ["status"], clean_env(ALLOCATOR_STORE="etcds://127.0.0.1:2379", ETCDCTL_CACERT=str(missing))
    )
    assert result.code == 2, result.err
    assert str(missing) in result.err


def test_sqlite_store_in_unwritable_place_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_cli(
        ["policy", "apply", str(EXAMPLE_POLICY)],
        clean_env(ALLOCATOR_STORE=f"sqlite://{blocker}/x/store.db"),
    )
    assert result.code in (2, 4), result.err
    assert len(result.err.strip().splitlines()) == 1
    assert str(blocker) in result.err


def _viewer_of(server: EtcdServer, policy: Path, prefix: str, *readable: str) -> dict[str, str]:
    """Apply ``policy`` as root; the environment of a user who may read only ``readable``."""
    root = f"etcd://root:{server.root_password}@{server.endpoint}"
    applied = run_cli(
        ["policy", "apply", str(policy)], clean_env(ALLOCATOR_STORE=root, ALLOCATOR_PREFIX=prefix)
    )
    assert applied.code == 0, applied.err
    server.etcdctl("role", "add", "viewer")
    for key in readable:
        prefixed = ["--prefix"] if key.endswith("/") else []
        server.etcdctl("role", "grant-permission", *prefixed, "viewer", "read", key)
    server.etcdctl("user", "add", "viewer:viewer-secret")
    server.etcdctl("user", "grant-role", "viewer", "viewer")
    return clean_env(
        ALLOCATOR_STORE=f"etcd://viewer:viewer-secret@{server.endpoint}", ALLOCATOR_PREFIX=prefix
    )


@pytest.mark.parametrize("hosts", [0, 300])  # 0: the example policy; 300: read in parts
def test_status_that_may_read_the_policy_but_not_the_hosts_exits_5_in_one_line(
    tmp_path: Path, prefix: str, hosts: int
) -> None:
    # status reads the hosts on other threads while it decodes the policy: a refusal
    # there is still the command's one line and exit code, with nothing printed.
    policy = EXAMPLE_POLICY
    if hosts:
        policy = tmp_path / "fleet.yaml"
        policy.write_text(fleet_policy(hosts))
    server = EtcdServer(tmp_path / "etcd", auth=True)
    server.start()
    try:
        layout = KeyLayout(prefix)
        viewer = _viewer_of(server, policy, prefix, layout.policy, layout.compiled_policy)
        for output in ("table", "json"):
            result = run_cli(["status", "-o", output], viewer)
            assert result.code == 5, (result.out, result.err)
            assert result.out == ""
            assert len(result.err.strip().splitlines()) == 1
            assert "Traceback" not in result.err and "secret" not in result.err
    finally:
        server.stop()


@pytest.mark.parametrize("compiled", [False, True])
def test_a_viewer_sees_every_host_with_or_without_the_compiled_policy(
    tmp_path: Path, prefix: str, compiled: bool
) -> None:
    # Without the compiled form (a role granted before there was one) status parses
    # the YAML and reads the hosts in one range; with it, in parts, each on its own
    # connection logged in with the same token (a refused part would be read again).
    policy = tmp_path / "fleet.yaml"
    policy.write_text(fleet_policy(300))
    server = EtcdServer(tmp_path / "etcd", auth=True)
    server.start()
    try:
        layout = KeyLayout(prefix)
        readable = [layout.policy, layout.hosts] + ([layout.compiled_policy] if compiled else [])
        viewer = _viewer_of(server, policy, prefix, *readable)
        before = server.requests_served("Range")
        result = run_cli(["status", "-o", "json"], viewer)
        ranges = server.requests_served("Range") - before
    finally:
        server.stop()
    assert result.code == 0, result.err
    assert [h["host"] for h in json.loads(result.out)["hosts"]] == [
        host_name(n) for n in range(300)
    ]
    assert ranges == (3 if compiled else 1)


class _Impostor:
    """A loopback server that answers every request with ``answer`` (not etcd)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while b"\r\n\r\n" not in (data := conn.recv(65536)) and data:
                pass
            conn.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()


_IMPOSTORS = {
    "empty json": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    "proxy 502": b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\n\r\nBad Gateway",
}


@pytest.mark.parametrize("answer", _IMPOSTORS.values(), ids=_IMPOSTORS.keys())
def test_commands_move_past_a_first_endpoint_that_is_not_etcd(
    etcd_server: EtcdServer, prefix: str, answer: bytes
) -> None:
    impostor = _Impostor(answer)
    try:
        url = f"etcd://{impostor.endpoint},{etcd_server.endpoint}"
        env = clean_env(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=prefix)
        for args in (
            ["policy", "apply", str(EXAMPLE_POLICY)],
            ["set", "job=train", "gpus=1", "host=node1"],
            ["get", "job=train"],
            ["status"],
        ):
            result = run_cli(args, env)
            assert result.code == 0, (args, result.err)
    finally:
        impostor.close()
