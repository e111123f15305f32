"""Waiting in the queue: what the waiter is told while it waits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

from allocator.control.client import Allocator
from allocator.control.gate import NotYourTurn
from allocator.placement.choose import Request
from allocator.recipes.queue.wait import wait_in_queue
from allocator.store import open_store

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
