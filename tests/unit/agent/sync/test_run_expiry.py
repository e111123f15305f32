"""The agent ends a killed run's holding in history: once, and never after run's own end."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec.structs import replace

from allocator.agent.sync.history_queue import HistoryQueue, write_pending
from allocator.agent.sync.run_expiry import EXPIRED_REASON, expiry_entry, vanished_runs
from allocator.history.append import prepare_append
from allocator.history.stream import host_stream, read_history
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry, RunHolder
from allocator.store import Compare, Op, Store, open_store

HOST = "node1"
LAYOUT = KeyLayout()
START = datetime(2026, 6, 1, 12, tzinfo=UTC)
RUN = Assignment(
    job="run-alice-7f3a",
    host=HOST,
    gpus=(0, 1),
    mode="gpu",
    updated_by="alice@node1",
    updated_at="2026-06-01T12:00:00Z",
    slots=2,
    run=RunHolder(pid=4242),
    holder="alice",
)
OPERATORS = Assignment(
    job="train", host=HOST, gpus=(2,), mode="gpu", updated_by="bob@h", updated_at=RUN.updated_at
)


def _log(event: str, fields: dict[str, Any]) -> None:
    pass


def _store() -> Store:
    return open_store(f"memory://{uuid.uuid4().hex}")


def _append(store: Store, action: str, job: str) -> int:
    """Append an entry as ``run`` or an operator would; the revision it was written at."""
    entry = HistoryEntry(seq=0, at="2026-06-01T12:00:09Z", by="alice@node1", action=action,
                         host=HOST, job=job)  # fmt: skip
    compare, ops = prepare_append(store, host_stream(LAYOUT, HOST), entry, None, lambda bad: None)
    return store.txn([compare], ops)


def _actions(store: Store) -> list[str]:
    found = read_history(store, LAYOUT, lambda bad: None, host=HOST, with_policy=False)
    return [s.entry.action for s in reversed(found)]


def _expire(store: Store, guard: int) -> int:
    pending = HistoryQueue(_log)
    entry = expiry_entry(RUN, HOST, START + timedelta(seconds=10))
    pending.add([entry], None, unless_ended_after=guard)
    written = write_pending(store, LAYOUT, HOST, pending, _log)
    assert len(pending) == 0
    return written


def test_only_run_held_assignments_that_are_gone_vanished() -> None:
    before = {RUN.job: RUN, OPERATORS.job: OPERATORS}
    revisions = {RUN.job: 7, OPERATORS.job: 8}
    assert vanished_runs(before, revisions, {}) == [(RUN, 7)]
    assert vanished_runs(before, revisions, {RUN.job: RUN}) == []


def test_the_expiry_entry_ends_the_holding_when_the_agent_saw_it_gone() -> None:
    entry = expiry_entry(RUN, HOST, START + timedelta(seconds=10))
    assert (entry.action, entry.by, entry.job) == ("expired", "agent@node1", RUN.job)
    assert entry.at == "2026-06-01T12:00:10Z" and entry.reason == EXPIRED_REASON
    assert entry.from_gpus == (0, 1) and entry.slots == 2
    assert entry.gpu_seconds == 20.0 and entry.exit_status is None and entry.holder == "alice"
    assert entry.detail == "held by allocator run (pid 4242)"


def test_a_submitted_jobs_expiry_names_who_submitted_it_not_the_agents_pid() -> None:
    submitted = replace(RUN, job="batch", run=RunHolder(pid=77, launched_by="submit"))
    entry = expiry_entry(submitted, HOST, START + timedelta(seconds=10))
    assert entry.detail == "submitted by alice (job batch, run by the agent on node1)"


def test_it_is_written_when_nothing_ended_the_holding() -> None:
    store = _store()
    held_at = _append(store, "set", RUN.job)  # the holding's start, in its own transaction
    _append(store, "release", "other")  # another job's end ends nothing of this one
    _expire(store, held_at)
    assert _actions(store) == ["set", "release", "expired"]


def test_it_is_skipped_when_run_released_the_holding_itself() -> None:
    store = _store()
    held_at = _append(store, "set", RUN.job)
    _append(store, "release", RUN.job)
    _expire(store, held_at)
    assert _actions(store) == ["set", "release"]


def test_an_end_of_an_earlier_holding_does_not_count() -> None:
    store = _store()
    _append(store, "set", RUN.job)
    _append(store, "release", RUN.job)
    held_at = _append(store, "set", RUN.job)
    _expire(store, held_at)
    assert _actions(store) == ["set", "release", "set", "expired"]


class ReleasedMeanwhile:
    """A store where ``run``'s release lands between the agent's check and its append."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.raced = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        if not self.raced:
            self.raced = True
            _append(self._store, "release", RUN.job)
        return self._store.txn(compares, ops)


def test_a_release_written_during_the_append_is_seen_on_the_retry() -> None:
    store = _store()
    held_at = _append(store, "set", RUN.job)
    racing = ReleasedMeanwhile(store)
    _expire(racing, held_at)  # type: ignore[arg-type]
    assert racing.raced and _actions(store) == ["set", "release"]
