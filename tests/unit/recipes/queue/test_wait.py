"""Waiting in the queue: what the waiter is told while it waits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.control.gate import NotYourTurn
from allocator.placement.choose import Request
from allocator.recipes.queue.tombstone import Cancelled, tombstone_ops
from allocator.recipes.queue.wait import wait_in_queue
from allocator.store import open_store
from allocator.store.base import Delete, KeyValue, Store

EXAMPLE = (Path(__file__).resolve().parents[4] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)


def test_the_waiter_hears_why_once_and_again_only_when_that_changes() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, clock=lambda: NOW, actor="alice@h")
    client.apply_policy(EXAMPLE, "p.yaml")
    refusals = iter(["held by job 'a'", "held by job 'a'", "behind b", "behind b", "behind b"])
    poke = client.layout.host_queue("node1") + "poke"

    def take(_gate: object) -> int:
        why = next(refusals, None)
        if why is None:
            return 42  # what the take wrote (a str would read as a refusal)
        store.put(poke, why.encode())  # a change the waiter watches: it tries again at once
        raise NotYourTurn(why)

    heard: list[str] = []
    request = Request(job="w", host="node1", count=1)
    assert wait_in_queue(client, request, take, timeout=60, on_wait=heard.append) == 42
    assert heard == ["held by job 'a'", "behind b"]
    assert store.list(client.layout.host_queue("node1")).items[0].key == poke  # its entry left


def _waiting_world() -> tuple[Allocator, Store]:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, clock=lambda: NOW, actor="alice@h")
    client.apply_policy(EXAMPLE, "p.yaml")
    return client, store


def test_a_waiter_reads_no_tombstone_round_after_round() -> None:
    """Only a deleted entry (or a watch that could have missed one) costs a tombstone read."""
    client, store = _waiting_world()
    reads: list[str] = []
    plain_get = store.get
    tombstones = f"{client.layout.root}/queue/cancelled/"

    def counting_get(key: str) -> KeyValue | None:
        if key.startswith(tombstones):
            reads.append(key)
        return plain_get(key)

    store.get = counting_get  # type: ignore[method-assign]
    poke = client.layout.host_queue("node1") + "poke"
    rounds = iter(range(8))

    def take(_gate: object) -> int:
        if next(rounds, None) is None:
            return 7
        store.put(poke, b"x")
        raise NotYourTurn("held by job 'a'")

    request = Request(job="w", host="node1", count=1)
    assert wait_in_queue(client, request, take, timeout=60, on_wait=lambda _why: None) == 7
    assert len(reads) <= 1, reads  # the watch's start, once


def test_a_cancelled_waiter_stops_naming_who_cancelled_it() -> None:
    client, store = _waiting_world()
    calls = iter(range(100))

    def take(_gate: object) -> int:
        if next(calls) == 2:  # the waiter has joined and watches: bob cancels it
            (entry,) = store.list(client.layout.host_queue("node1")).items
            store.txn([], [Delete(entry.key), *tombstone_ops(client, [entry.key], "bob@h")])
        raise NotYourTurn("held by job 'a'")

    request = Request(job="w", host="node1", count=1)
    with pytest.raises(Cancelled, match="cancelled by bob@h"):
        wait_in_queue(client, request, take, timeout=60, on_wait=lambda _why: None)
