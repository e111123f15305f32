"""``allocator serve`` survives its clients: silent connections, foreign Host names, sniffing.

A real server process on a free loopback port, reading SQLite, run with a
small file-descriptor limit so that connections which never send a request
would exhaust it if they were kept.
"""

from __future__ import annotations

import http.client
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import EXAMPLE_POLICY, clean_env, run_cli
from tests.support.etcd_server import free_port
from tests.support.serving import ServeProcess
from tests.support.waiting import wait_for

FD_LIMIT = 256


class Server(ServeProcess):
    def __init__(self, tmp: Path, *extra: str) -> None:
        env = clean_env(ALLOCATOR_STORE=f"sqlite://{tmp / 'store.db'}")
        assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0

        def small_fd_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

        super().__init__(env, tmp / "serve.log", *extra, preexec_fn=small_fd_limit)
        self.wait_until(
            "serve to answer", lambda: self.request("/api/v1/status")[0] == 200, timeout=15
        )

    def request(
        self, path: str, host: str | None = None, timeout: float = 5.0
    ) -> tuple[int, dict[str, str]]:
        self.check_running()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Host": host} if host is not None else {}
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}
        except OSError:
            return 0, {}
        finally:
            connection.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    served = Server(tmp_path, "--request-timeout", "1")
    try:
        yield served
    finally:
        served.close()


def test_connections_that_never_send_a_request_do_not_starve_the_api(server: Server) -> None:
    silent = []
    try:
        for _ in range(FD_LIMIT + 44):  # more than the server may hold open
            silent.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        # The server closes each silent connection after --request-timeout, so the API
        # answers again well before the clients give up.
        wait_for(
            "the API to answer beside the silent connections",
            lambda: server.request("/api/v1/status", timeout=3)[0] == 200,
            timeout=30,
        )
    finally:
        for sock in silent:
            sock.close()


def test_a_host_name_it_was_not_given_is_refused(server: Server) -> None:
    assert server.request("/api/v1/status", host="rebind.attacker.example")[0] == 400
    assert server.request("/api/v1/status", host=f"127.0.0.1:{server.port}")[0] == 200
    assert server.request("/api/v1/status", host=f"localhost:{server.port}")[0] == 200


def test_every_answer_says_nosniff_and_the_page_allows_only_itself(server: Server) -> None:
    code, headers = server.request("/")
    assert code == 200
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "'sha256-" in policy and "unsafe-inline" not in policy
    for path in ("/", "/api/v1/status", "/metrics"):
        assert server.request(path)[1]["x-content-type-options"] == "nosniff"


def test_named_hosts_replace_the_defaults(tmp_path: Path) -> None:
    served = Server(tmp_path, "--allowed-host", "gpus.example.org", "--allowed-host", "127.0.0.1")
    try:
        assert served.request("/api/v1/status", host="gpus.example.org")[0] == 200
        assert served.request("/api/v1/status", host=f"localhost:{served.port}")[0] == 400
    finally:
        served.close()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--max-connections", "0"], "--max-connections 0"),
        (["--max-client-connections", "0"], "--max-client-connections 0"),
        (["--request-timeout", "0"], "--request-timeout 0"),
        (["--sample-seconds", "0"], "--sample-seconds 0"),
        (["--series-points", "0"], "--series-points 0"),
    ],
)
def test_limits_out_of_range_are_refused_in_one_line(
    tmp_path: Path, args: list[str], words: str
) -> None:
    env = clean_env(ALLOCATOR_STORE=f"sqlite://{tmp_path / 'store.db'}")
    result = run_cli(["serve", "--listen", f"127.0.0.1:{free_port()}", *args], env)
    assert result.code == 2 and result.err.count("\n") == 1 and words in result.err
