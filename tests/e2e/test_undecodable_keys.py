"""A key that is not UTF-8 text, written straight into the store, is one bad record, not an outage.

``etcdctl put "$(printf '/allocator/v1/hosts/node1/notes/\\xff')" x`` (here:
etcd's JSON gateway, which takes any bytes as a base64 key) or a row put by
hand with ``sqlite3``. Every reader skips the key and reports it: the agent
still carries out a release, ``status`` exits 0 and names the key, ``set``
works, ``serve`` keeps following the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.records.keys import KeyLayout
from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.e2e.conftest import Cli
from tests.e2e.serve_harness import Served
from tests.support.raw_store import put_raw_key
from tests.support.waiting import wait_for

#: Printed for the key: its bytes that are not UTF-8 escaped (JSON doubles the backslash).
ESCAPED = "notes/\\\\xff"


def _bad_key(prefix: str, host: str = HOST) -> bytes:
    return KeyLayout(prefix).host(host).encode() + b"notes/\xff"


def test_status_reports_the_key_and_set_and_get_work(
    applied: Cli, store_url: str, prefix: str
) -> None:
    assert applied("set", "job=train", "gpus=0", "host=node1").code == 0
    put_raw_key(store_url, _bad_key(prefix), b"x")

    status = applied("status", "-o", "json")
    assert status.code == 0, status.err
    assert ESCAPED in status.err and "not UTF-8" in status.err and "Traceback" not in status.err
    hosts = {h["host"]: h for h in json.loads(status.out)["hosts"]}
    assert {g["gpu"]: g["holder"] for g in hosts["node1"]["gpus"]}["0"] == "train"

    moved = applied("set", "job=eval", "gpus=1", "host=node1")
    assert moved.code == 0, moved.err
    assert "notes/\\xff" in moved.err and len(moved.err.splitlines()) <= 2

    got = applied("get", "job=eval")
    assert got.code == 0 and "gpus 1" in got.out, got.err


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    with AgentHarness(tmp_path, store_url, prefix).running() as harness:
        yield harness


def test_the_agent_still_carries_out_a_release(
    world: AgentHarness, store_url: str, prefix: str
) -> None:
    assert world.cli("set", "job=train", "gpus=0").code == 0
    pid = world.new_report("train")["pid"]
    put_raw_key(store_url, _bad_key(prefix), b"x")
    # The assignment deleted straight in the store: only the agent's reading is tested here
    # (the CLI's own release is tested above, as set).
    store = open_store(store_url)
    try:
        assert store.delete(KeyLayout(prefix).assignment(HOST, "train"))
    finally:
        store.close()
    wait_for("the worker to stop", lambda: not pid_alive(pid), timeout=15)
    wait_for("the worker record to go", lambda: world.worker_record("train") is None)


def test_serve_keeps_following_the_store(served: Served, store_url: str, prefix: str) -> None:
    put_raw_key(store_url, _bad_key(prefix, "node2"), b"x")
    assert served.cli("set", "job=train", "gpus=1", "host=node1").code == 0
    printed = json.loads(served.cli("status", "-o", "json").out)

    def caught_up() -> bool:
        code, body, _ = served.get("/api/v1/status")
        return code == 200 and json.loads(body)["revision"] == printed["revision"]

    wait_for("the API to show the set", caught_up, timeout=15)
    code, body, _ = served.get("/metrics")
    assert code == 200 and b"allocator_store_up 1" in body
