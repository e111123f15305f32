"""Fixtures shared by every test directory: key prefixes and real servers."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: it is a timing assertion, and these machines are
# shared (a loaded one made a correct decoder "fail"). CI runs the same
# examples every time, so a landing never hinges on a lucky draw; local runs
# keep exploring new ones (and the database replays failures).
settings.register_profile("local", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "local")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first, in their usual order; the rest follow as collected.

    Test processes take the next tests as they free up (``make test``'s
    ``--maxschedchunk``): a minute-long test started last would end the run
    a minute after every other process went idle.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _not_left_a_subreaper() -> Iterator[None]:
    """The test process is not left a child subreaper by a test that made it one.

    An in-process ``Supervisor`` makes this process a subreaper (as the agent
    is). Left so, every later test's orphans (the workers of an agent it
    kills) would become this process's children, zombies nobody reaps, and
    a test waiting for them to go would wait for ever.
    """
    yield
    if sys.platform.startswith("linux"):
        _prctl(_PR_SET_CHILD_SUBREAPER, 0)


_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    _libc().prctl(option, value, 0, 0, 0)


@functools.cache
def _libc() -> Any:
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[bytes]]:
    """A process from outside the allocator (someone's notebook), killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def prefix() -> str:
    """A key prefix unique to this test, so tests never see each other's data."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real etcd (Debian's etcd-server) on free loopback ports, shared by the session."""
    from tests.support.etcd_server import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_server_private(tmp_path: Path) -> Iterator[object]:
    """A real etcd of this test's own, for tests that stop and restart it."""
    from tests.support.etcd_server import EtcdServer

    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[object]:
    """A real 3-member etcd cluster of this test's own, for tests that kill and freeze members."""
    from tests.support.etcd_cluster import EtcdCluster

    cluster = EtcdCluster(tmp_path / "etcd-cluster")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def consul_url() -> Iterator[str]:
    """A real Consul agent when CONSUL_HTTP_ADDR is set, else the KV test double.

    The double's sessions last a fifth of their TTL (its double-only
    ``ttl_scale``: Consul's 10 s minimum becomes 2 s), so lease tests see a
    lease expire in seconds; the lease tests measure expiry against a
    lease they leave alone, so they hold against a real agent too.
    """
    addr = os.environ.get("CONSUL_HTTP_ADDR")
    if addr:
        scheme = "consuls" if addr.startswith("https://") else "consul"
        yield f"{scheme}://{addr.split('://')[-1]}"
        return
    from tests.support.consul_double import ConsulDouble

    double = ConsulDouble(ttl_scale=0.2)
    double.start()
    try:
        yield double.url
    finally:
        double.stop()
