"""serve's usage answers count the holdings its mirror holds: the fleet is not read again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.serve.mirror import FleetMirror
from allocator.serve.usage import UsageAnswers, mirrored_assignments
from allocator.status.usage_report import assignments_in
from allocator.store import KeyValue, Store, open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 8}\n  node2: {gpus: 8}\n"
NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def _fleet() -> tuple[Store, Allocator]:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, clock=lambda: NOW, actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    client.assign(Request(job="train", host="node1", count=2))
    client.assign(Request(job="eval", host="node2", count=1))
    return store, client


def test_only_the_jobs_keys_are_decoded() -> None:
    store, client = _fleet()
    layout = client.layout
    listing = store.list(layout.hosts)
    garbage = KeyValue(
        key=layout.agent("node2"), value=b"{not json", mod_revision=1, create_revision=1
    )
    found = {(a.host, a.job): a for a in assignments_in([*listing.items, garbage], layout)}
    assert sorted(found) == [("node1", "train"), ("node2", "eval")]
    assert found["node1", "train"].gpus == (0, 1)


def test_serve_counts_its_mirrors_assignments_without_reading_the_hosts(
    monkeypatch: object,
) -> None:
    store, client = _fleet()
    layout = client.layout
    mirror = FleetMirror(layout)
    mirror.reset(store.list(layout.hosts))
    reads: list[str] = []
    plain_list = store.list

    def watched_list(prefix: str, **kwargs: object) -> object:
        reads.append(prefix)
        return plain_list(prefix, **kwargs)  # type: ignore[arg-type]

    store.list = watched_list  # type: ignore[method-assign,assignment]
    store.close = lambda: None  # type: ignore[method-assign]
    answers = UsageAnswers(lambda: store, layout, current=lambda: mirrored_assignments(mirror))
    status, document = answers.answer({"since": "1d", "by": "user"})
    assert status == 200, document
    assert layout.hosts not in reads  # the mirror's, not a second read of the fleet
    assert len(document["rows"]) == 1  # the holder of both (the process's user)
    assert document["rows"][0]["holdings"] == 2


def test_the_mirror_hands_usage_its_assignment_keys_only() -> None:
    store, client = _fleet()
    layout = client.layout
    store.put(layout.agent("node2"), b"{not json")  # an agent's record: never usage's
    mirror = FleetMirror(layout)
    mirror.reset(store.list(layout.hosts))

    keys = sorted(item.key for item in mirror.assignment_items())

    assert keys == [layout.assignment("node1", "train"), layout.assignment("node2", "eval")]
    assert sorted((a.host, a.job) for a in mirrored_assignments(mirror)) == [
        ("node1", "train"),
        ("node2", "eval"),
    ]
