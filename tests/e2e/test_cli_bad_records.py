"""Garbage written straight into the store never takes the fleet commands down."""

from __future__ import annotations

import json

from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import open_store
from tests.e2e.conftest import Cli


def _write_raw(store_url: str, prefix: str, entries: dict[str, bytes]) -> None:
    store = open_store(store_url)
    try:
        for key, value in entries.items():
            store.put(key, value)
    finally:
        store.close()


def test_status_set_and_get_skip_bad_records_and_say_so(
    applied: Cli, store_url: str, prefix: str
) -> None:
    assert applied("set", "job=train", "gpus=0", "host=node1").code == 0
    layout = KeyLayout(prefix)
    impostor = Assignment("train", "node1", (1,), "gpu", "mallory", "t").to_json()
    _write_raw(
        store_url,
        prefix,
        {
            layout.assignment("node1", "ghost"): impostor,  # body says train
            layout.workers("node1", "train"): b'{"schema_version": 1, "job": ["train"]}',
            layout.agent("node2"): b"\x00 not json",
            layout.assignment("node2", "odd"): b'{"schema_version": 1, "gpus": "1,2"}',
        },
    )
    status = applied("status", "-o", "json")
    assert status.code == 0, status.err
    hosts = {h["host"]: h for h in json.loads(status.out)["hosts"]}
    assert {g["gpu"]: g["holder"] for g in hosts["node1"]["gpus"]}["0"] == "train"
    assert {g["gpu"]: g["holder"] for g in hosts["node1"]["gpus"]}["1"] is None
    assert len(hosts["node1"]["bad_records"]) == 2 and len(hosts["node2"]["bad_records"]) == 2

    table = applied("status")
    assert table.code == 0 and "disagrees with the key" in table.out

    moved = applied("set", "job=eval", "gpus=1", "host=node1")
    assert moved.code == 0, moved.err
    assert "skipped bad record" in moved.err and "Traceback" not in moved.err

    got = applied("get", "job=train")
    assert got.code == 0, got.err
    assert "gpus 0" in got.out and "gpus 1" not in got.out


def test_status_still_answers_when_the_policy_record_is_damaged(
    applied: Cli, store_url: str, prefix: str
) -> None:
    assert applied("set", "job=train", "gpus=0", "host=node1").code == 0
    _write_raw(store_url, prefix, {KeyLayout(prefix).policy: b'{"schema_version": 1, "yaml": 3}'})
    status = applied("status", "-o", "json")
    assert status.code == 0, status.err
    assert "skipped bad record" in status.err and KeyLayout(prefix).policy in status.err
    hosts = {h["host"]: h for h in json.loads(status.out)["hosts"]}
    assert {g["gpu"]: g["holder"] for g in hosts["node1"]["gpus"]}["0"] == "train"
    refused = applied("set", "job=eval", "gpus=1", "host=node1")
    assert refused.code == 1 and len(refused.err.splitlines()) == 1
    assert "policy apply" in refused.err  # says how to repair it
