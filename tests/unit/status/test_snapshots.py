"""Decoding a read of many hosts: every record in its place, every bad one reported, none lost.

``snapshots_by_host`` decodes a record written as this allocator writes it
in one call and sends anything else through the checked path: these tests
hold both paths to the same answers, and the bad records to their messages.
"""

from __future__ import annotations

import json

from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.status.snapshots import snapshots_by_host
from allocator.store import KeyValue

LAYOUT = KeyLayout("/s")
HELD = Assignment("train", "node1", (0, 1), "gpu", "ops@x", "2026-06-01T00:00:00Z")
WORKER = WorkerRecord(job="train", host="node1", state="running", pids=(7,), gpus=(0, 1))
AGENT = AgentRecord(host="node1", gpus=(GpuInfo(0, "GPU-a"), GpuInfo(1, "GPU-b")))


def _kv(key: str, raw: bytes, revision: int = 5) -> KeyValue:
    return KeyValue(key, raw, revision, revision)


def _reworded(raw: bytes) -> bytes:
    """The same record as another writer words it: spaced out, schema_version first."""
    body = json.loads(raw)
    return json.dumps({"schema_version": body.pop("schema_version"), **body}, indent=1).encode()


def test_each_kind_of_key_lands_in_its_hosts_snapshot() -> None:
    items = [
        _kv(LAYOUT.agent("node1"), AGENT.to_json(), 4),
        _kv(LAYOUT.host_generation("node1"), b"1", 9),
        _kv(LAYOUT.assignment("node1", "train"), HELD.to_json()),
        _kv(LAYOUT.workers("node1", "train"), WORKER.to_json()),
        _kv(LAYOUT.host_generation("node2"), b"1", 3),
    ]
    hosts = snapshots_by_host(items, LAYOUT, 12)
    one, two = hosts["node1"], hosts["node2"]
    assert one.assignments == {"train": HELD} and one.workers == {"train": WORKER}
    assert (one.agent, one.agent_revision, one.generation, one.revision) == (AGENT, 4, 9, 12)
    assert (two.assignments, two.agent, two.generation, two.bad_records) == ({}, None, 3, ())


def test_a_record_worded_otherwise_reads_as_the_same_record() -> None:
    items = [
        _kv(LAYOUT.agent("node1"), _reworded(AGENT.to_json())),
        _kv(LAYOUT.assignment("node1", "train"), _reworded(HELD.to_json())),
        _kv(LAYOUT.workers("node1", "train"), _reworded(WORKER.to_json())),
    ]
    (host,) = snapshots_by_host(items, LAYOUT, 1).values()
    assert (host.assignments, host.workers, host.agent) == (
        {"train": HELD},
        {"train": WORKER},
        AGENT,
    )
    assert host.bad_records == ()


def test_a_body_naming_another_job_or_host_is_reported_not_filed_under_the_key() -> None:
    elsewhere = WorkerRecord(job="train", host="node2", state="running")
    items = [
        _kv(LAYOUT.assignment("node1", "ghost"), HELD.to_json()),  # its body says "train"
        _kv(LAYOUT.workers("node1", "train"), elsewhere.to_json()),  # its body says node2
        _kv(LAYOUT.assignment("node1", "train"), HELD.to_json()),
    ]
    (host,) = snapshots_by_host(items, LAYOUT, 1).values()
    assert host.assignments == {"train": HELD} and host.workers == {}
    messages = [str(bad) for bad in host.bad_records]
    assert len(messages) == 2
    assert "job 'train' disagrees with the key" in messages[0]
    assert "host 'node2' disagrees with the key" in messages[1]


def test_garbage_a_newer_record_and_a_damaged_agent_are_each_reported() -> None:
    newer = HELD.to_json().replace(b'"schema_version":1}', b'"schema_version":2}')
    items = [
        _kv(LAYOUT.agent("node1"), b"\xff not json", 8),
        _kv(LAYOUT.assignment("node1", "train"), newer),
        _kv(LAYOUT.workers("node1", "train"), b'{"job": "train", "schema_version": 1'),
    ]
    (host,) = snapshots_by_host(items, LAYOUT, 1).values()
    assert (host.agent, host.assignments, host.workers) == (None, {}, {})
    assert host.agent_revision == 8  # a write checked against the agent still compares it
    words = " | ".join(map(str, host.bad_records))
    assert "not valid JSON" in words
    assert "schema_version 2" in words and "newer allocator" in words
    assert len(host.bad_records) == 3


def test_keys_outside_the_hosts_or_deeper_than_a_record_are_passed_over() -> None:
    items = [
        _kv("/s/v1/queue/node1/0001", b"{}"),
        _kv(LAYOUT.assignment("node1", "train") + "/extra", b"{}"),
        _kv(LAYOUT.assignment("node1", "train"), HELD.to_json()),
    ]
    hosts = snapshots_by_host(items, LAYOUT, 1)
    assert list(hosts) == ["node1"]
    assert hosts["node1"].assignments == {"train": HELD} and hosts["node1"].bad_records == ()
