"""A normal waiter at its turn marks the preemptible holdings it needs, and only then."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.recipes.queue.preempt import preempt_for
from allocator.records.holders import QueueEntry
from allocator.records.types import Assignment
from allocator.store import Put, open_store

EXAMPLE = (Path(__file__).resolve().parents[4] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture
def client() -> Allocator:
    """node1: GPU 0 held by the preemptible ``p``, 1 and 2 by the normal ``n`` (3 is reserved)."""
    store = open_store(f"memory://{uuid.uuid4().hex}")
    found = Allocator(store, clock=lambda: NOW, actor="alice@h")
    found.apply_policy(EXAMPLE, "p.yaml")
    found.assign(Request(job="p", host="node1", gpus=(0,), preemptible=True))
    found.assign(Request(job="n", host="node1", gpus=(1, 2)))
    return found


def _wait(client: Allocator, job: str, gpus: tuple[int, ...], name: str) -> str:
    """A leased queue entry of ``job`` (a live waiter's); its key."""
    entry = QueueEntry(job=job, host="node1", holder="alice", since="t", gpus=gpus)
    key = client.layout.queue_entry("node1", name)
    lease = client.store.grant_lease(30)
    client.store.txn([], [Put(key, entry.to_json(), lease)])
    return key


def _preempted_by(client: Allocator, job: str) -> str:
    found = client.store.get(client.layout.assignment("node1", job))
    assert found is not None
    return Assignment.from_json(found.value).preempted_by


def test_the_waiter_at_its_turn_marks_the_preemptible_holder_of_its_gpu(client: Allocator) -> None:
    me = _wait(client, "w", (0,), "a1")
    assert preempt_for(client, Request(job="w", host="node1", gpus=(0,)), me) == "preempting p"
    assert _preempted_by(client, "p") == "w"
    assert _preempted_by(client, "n") == ""
    # Asked again while it stops: nothing more is written, it waits for it.
    assert preempt_for(client, Request(job="w", host="node1", gpus=(0,)), me) == "preempting p"


def test_a_waiter_behind_another_that_could_use_the_gpu_marks_nothing(client: Allocator) -> None:
    _wait(client, "first", (0,), "a1")
    me = _wait(client, "second", (0,), "a2")
    assert preempt_for(client, Request(job="second", host="node1", gpus=(0,)), me) is None
    assert _preempted_by(client, "p") == ""


def test_a_waiter_for_a_normal_holding_or_that_fits_anyway_marks_nothing(client: Allocator) -> None:
    me = _wait(client, "w", (0, 1), "a1")
    assert preempt_for(client, Request(job="w", host="node1", gpus=(0, 1)), me) is None
    assert _preempted_by(client, "p") == ""
    client.release("node1", "n")
    free = _wait(client, "v", (1,), "a2")
    assert preempt_for(client, Request(job="v", host="node1", gpus=(1,)), free) is None
    assert _preempted_by(client, "p") == ""
