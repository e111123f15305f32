"""A preemptible holding hears its mark from a watch of its key, once."""

from __future__ import annotations

from allocator.recipes.preempt_watch import PreemptWatch, preempted_by
from allocator.records.types import Assignment
from allocator.store import Put, Store
from tests.support.waiting import wait_for

KEY = "/t/hosts/node1/assignments/pre"


def _held(by: str = "") -> bytes:
    return Assignment(
        job="pre", host="node1", gpus=(0,), mode="gpu", updated_by="a",
        updated_at="2026-06-01T10:00:00Z", preemptible=True, preempted_by=by,
    ).to_json()  # fmt: skip


def test_the_mark_is_told_once_and_other_keys_are_not_looked_at(store: Store) -> None:
    store.txn([], [Put(KEY, _held())])
    told: list[str] = []
    watch = PreemptWatch(store, KEY, told.append)
    watch.start()
    try:
        store.txn([], [Put(KEY + "2", _held("someone"))])  # another job's key, same prefix
        store.txn([], [Put(KEY, _held())])
        store.txn([], [Put(KEY, _held("train"))])
        wait_for("the mark to be told", lambda: told)
        store.txn([], [Put(KEY, _held("again"))])
    finally:
        watch.stop()
    assert told == ["train"]


def test_a_mark_made_before_the_watch_began_is_told(store: Store) -> None:
    store.txn([], [Put(KEY, _held("early"))])
    told: list[str] = []
    watch = PreemptWatch(store, KEY, told.append)
    watch.start()
    try:
        wait_for("the mark to be told", lambda: told)
    finally:
        watch.stop()
    assert told == ["early"]


def test_an_unreadable_or_missing_record_names_no_one() -> None:
    assert preempted_by(None) == ""
    assert preempted_by(b"{not json") == ""
    assert preempted_by(_held("train")) == "train"
