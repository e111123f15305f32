"""Which queue entries a cancel ends, and the owner rule."""

from __future__ import annotations

import pytest

from allocator.errors import NotFound, NotPermitted
from allocator.recipes.cancel import choose_pending
from allocator.recipes.queue.order import Waiting
from allocator.records.holders import QueueEntry


def _waiting(job: str, holder: str, name: str) -> Waiting:
    entry = QueueEntry(job=job, host="h1", holder=holder, since="2026-01-01T00:00:00Z", count=1)
    return Waiting(f"/allocator/v1/queue/hosts/h1/{name}", entry, 1, 1)


QUEUE = [_waiting("sweep", "alice", "e1"), _waiting("train", "bob", "e2")]


def test_the_owner_cancels_their_job() -> None:
    chosen = choose_pending(QUEUE, "sweep", "alice", operator=False)
    assert [w.name for w in chosen] == ["e1"]


def test_someone_else_is_refused() -> None:
    with pytest.raises(NotPermitted, match="waits for alice, not for bob"):
        choose_pending(QUEUE, "sweep", "bob", operator=False)


def test_an_operator_cancels_anyones() -> None:
    chosen = choose_pending(QUEUE, "sweep", "bob", operator=True)
    assert [w.entry.job for w in chosen] == ["sweep"]


def test_a_job_waiting_nowhere_is_not_found() -> None:
    with pytest.raises(NotFound):
        choose_pending(QUEUE, "absent", "alice", operator=True)


def test_me_chooses_every_entry_of_the_asker() -> None:
    chosen = choose_pending(QUEUE, None, "bob", operator=False)
    assert [w.entry.job for w in chosen] == ["train"]


def test_cancel_pending_deletes_exactly_what_was_read() -> None:
    from allocator.control.client import Allocator
    from allocator.errors import CasConflict
    from allocator.recipes.cancel import cancel_pending, pending_entries
    from allocator.store.memory import open_memory

    allocator = Allocator(open_memory("memory://"), prefix="/allocator")
    for waiting in QUEUE:
        key = allocator.layout.queue_entry("h1", waiting.name)
        allocator.store.put(key, waiting.entry.to_json())
    read = pending_entries(allocator, "h1")
    sweep = choose_pending(read, "sweep", "alice", operator=False)
    train = choose_pending(read, "train", "bob", operator=False)
    allocator.store.put(train[0].key, train[0].entry.to_json())  # moved since read
    with pytest.raises(CasConflict):
        cancel_pending(allocator, train)
    cancel_pending(allocator, sweep)
    assert [w.entry.job for w in pending_entries(allocator, None)] == ["train"]
