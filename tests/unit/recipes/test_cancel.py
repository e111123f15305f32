"""Which queue entries a cancel ends, and the owner rule."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from allocator.errors import NotFound, NotPermitted
from allocator.recipes.cancel import choose, choose_pending
from allocator.recipes.queue.order import Waiting
from allocator.records.holders import QueueEntry
from allocator.records.types import Assignment


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


def _held(job: str, holder: str) -> Assignment:
    return Assignment(
        job=job, host="h1", gpus=(0,), mode="gpu", updated_by="t", updated_at="t", holder=holder
    )


HELD = [_held("train", "bob"), _held("eval", "bob")]


def _only(allowed: str) -> Callable[[str], bool]:
    return lambda holder: holder == allowed


def test_choose_finds_a_job_running_and_waiting() -> None:
    chosen = choose([*QUEUE, _waiting("train", "bob", "e3")], HELD, "train", "bob", _only("bob"))
    assert [w.name for w in chosen.pending] == ["e2", "e3"]
    assert [a.job for a in chosen.running] == ["train"]


def test_choose_refuses_another_users_running_job() -> None:
    with pytest.raises(NotPermitted, match="runs for bob, not for alice"):
        choose(QUEUE, HELD, "eval", "alice", _only("alice"))
    with pytest.raises(NotPermitted, match="waits for bob, not for alice"):
        choose(QUEUE, HELD, "train", "alice", _only("alice"))


def test_choose_lets_an_operator_end_anyones() -> None:
    chosen = choose(QUEUE, HELD, "train", "carol", lambda _holder: True)
    assert ([w.name for w in chosen.pending], len(chosen.running)) == (["e2"], 1)


def test_choose_says_not_found_when_nothing_waits_or_runs() -> None:
    with pytest.raises(NotFound, match="neither waits nor runs"):
        choose(QUEUE, HELD, "absent", "alice", lambda _holder: True)
    with pytest.raises(NotFound, match="nothing of carol's"):
        choose(QUEUE, HELD, None, "carol", lambda _holder: True)


def test_choose_me_takes_only_the_askers_own() -> None:
    chosen = choose(QUEUE, HELD, None, "bob", lambda _holder: True)
    assert [w.name for w in chosen.pending] == ["e2"]
    assert [a.job for a in chosen.running] == ["train", "eval"]
