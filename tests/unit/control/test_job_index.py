"""The job index: written with every assignment change, read to find a job."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.control.job_index import index_complete
from allocator.errors import BadRecord
from allocator.placement.choose import Request
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, JobIndex, PolicyRecord
from allocator.store import (
    Compare,
    KeyValue,
    Op,
    Read,
    Store,
    TxnOutcome,
    open_store,
)
from tests.support.reads import CountingStore

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)
LAYOUT = KeyLayout()


@pytest.fixture
def store() -> Store:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    Allocator(store, clock=lambda: NOW, actor="ops@h").apply_policy(EXAMPLE, "p.yaml")
    return store


def _ops(store: object) -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor="ops@h")  # type: ignore[arg-type]


def _index(store: Store, job: str) -> tuple[str, ...] | None:
    item = store.get(LAYOUT.job_index(job))
    return None if item is None else decode_record(item.value, JobIndex, item.key).hosts


def test_set_and_release_keep_the_index_naming_every_host_the_job_holds(store: Store) -> None:
    ops = _ops(store)
    ops.assign(Request(job="train", host="node1", gpus=(0,)))
    assert _index(store, "train") == ("node1",)
    ops.assign(Request(job="train", host="node2", gpus=(0,)))
    ops.assign(Request(job="train", host="node1", gpus=(1,)))  # a move: still one entry
    assert _index(store, "train") == ("node1", "node2")
    ops.release("node1", "train")
    assert _index(store, "train") == ("node2",)
    ops.release("node2", "train")
    assert _index(store, "train") is None


def test_finding_a_job_reads_its_index_not_every_host(store: Store) -> None:
    _ops(store).assign(Request(job="train", host="node2", gpus=(3,)))
    counting = CountingStore(store)
    found = _ops(counting).find_job("train")
    assert [(a.host, a.gpus) for a in found] == [("node2", (3,))]
    assert counting.prefixes == []  # no prefix read at all


def _store_from_before_the_index() -> Store:
    """A store whose assignment was written with no index entry, then a policy applied."""
    store = open_store(f"memory://{uuid.uuid4().hex}")
    old = Assignment("train", "node1", (0,), "gpu", "ops@h", "2026-01-01T00:00:00Z")
    store.put(LAYOUT.assignment("node1", "train"), old.to_json())  # written with no index
    _ops(store).apply_policy(EXAMPLE, "p.yaml")
    return store


def _policy_says_indexed(store: Store) -> bool:
    item = store.get(LAYOUT.policy)
    assert item is not None
    return decode_record(item.value, PolicyRecord, item.key).job_index


def test_a_store_from_before_the_index_is_scanned_and_its_index_rebuilt() -> None:
    store = _store_from_before_the_index()
    assert not _policy_says_indexed(store)  # apply saw the assignment without its entry
    counting = CountingStore(store)
    assert [a.host for a in _ops(counting).find_job("train")] == ["node1"]
    assert counting.prefixes == [LAYOUT.hosts]
    _ops(store).assign(Request(job="train", host="node2", gpus=(0,)))
    assert _index(store, "train") == ("node1", "node2")  # the first host is not lost


def test_a_new_jobs_first_set_reads_no_other_host_under_an_indexed_policy(store: Store) -> None:
    assert _policy_says_indexed(store)
    counting = CountingStore(store)
    _ops(counting).assign(Request(job="fresh", host="node1", gpus=(2,)))
    assert LAYOUT.hosts not in counting.prefixes  # no other host was read
    assert _index(store, "fresh") == ("node1",)


def test_a_new_jobs_first_set_searches_every_host_without_an_indexed_policy() -> None:
    store = _store_from_before_the_index()
    counting = CountingStore(store)
    _ops(counting).assign(Request(job="fresh", host="node1", gpus=(2,)))
    assert LAYOUT.hosts in counting.prefixes


def test_a_policy_is_indexed_once_every_job_has_its_entry() -> None:
    store = _store_from_before_the_index()
    ops = _ops(store)
    ops.assign(Request(job="train", host="node2", gpus=(0,)))  # rebuilds train's entry
    ops.apply_policy(EXAMPLE.replace("version: 1", "version: 1  # v2", 1), "p.yaml")
    assert _policy_says_indexed(store)


@pytest.mark.parametrize(
    "entry",
    [
        None,  # no entry at all
        b'{"schema_version": 1, "job": "train", "hosts": 7}',  # damaged
        JobIndex("train", ("node2",)).to_json(),  # names another host only
    ],
)
def test_an_assignment_without_an_entry_naming_its_host_is_not_indexed(
    entry: bytes | None,
) -> None:
    held = Assignment("train", "node1", (0,), "gpu", "ops@h", "2026-01-01T00:00:00Z")
    hosts = [KeyValue(LAYOUT.assignment("node1", "train"), held.to_json(), 5, 5)]
    index = [] if entry is None else [KeyValue(LAYOUT.job_index("train"), entry, 6, 6)]
    assert not index_complete(hosts, index, LAYOUT)
    whole = [KeyValue(LAYOUT.job_index("train"), JobIndex("train", ("node1",)).to_json(), 6, 6)]
    assert index_complete(hosts, whole, LAYOUT)


def test_a_damaged_index_is_reported_and_found_around(store: Store) -> None:
    _ops(store).assign(Request(job="train", host="node1", gpus=(0,)))
    store.put(LAYOUT.job_index("train"), b'{"schema_version": 1, "job": "train", "hosts": 7}')
    seen: list[BadRecord] = []
    ops = Allocator(store, clock=lambda: NOW, actor="ops@h", on_bad_record=seen.append)
    assert [a.host for a in ops.find_job("train")] == ["node1"]
    assert [b.key for b in seen] == [LAYOUT.job_index("train")]
    ops.assign(Request(job="train", host="node2", gpus=(1,)))
    assert _index(store, "train") == ("node1", "node2")  # repaired by the next change


def test_a_concurrent_change_of_the_same_job_is_not_lost(store: Store) -> None:
    bob = _ops(store)

    class SameJobElsewhere:
        """Bob sets the same job on node2 just before our first transaction."""

        def __init__(self) -> None:
            self.txns = 0

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def txn_or_read(
            self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
        ) -> TxnOutcome:
            if self.txns == 0:
                bob.assign(Request(job="train", host="node2", gpus=(0,)))
            self.txns += 1
            return store.txn_or_read(compares, ops, reads)

    racing = SameJobElsewhere()
    _ops(racing).assign(Request(job="train", host="node1", gpus=(0,)))
    assert racing.txns == 2  # the index compare lost once, then it re-read
    assert _index(store, "train") == ("node1", "node2")


def test_an_entry_deleted_by_hand_is_rebuilt_when_the_host_changed_holds_the_job(
    store: Store,
) -> None:
    ops = _ops(store)
    ops.assign(Request(job="train", host="node1", gpus=(0,)))
    ops.assign(Request(job="train", host="node2", gpus=(0,)))
    store.delete(LAYOUT.job_index("train"))  # lost by hand, under an indexed policy
    ops = _ops(store)  # a fresh client: nothing kept from the writes above
    ops.assign(Request(job="train", host="node1", gpus=(1,)))
    assert _index(store, "train") == ("node1", "node2")  # node2 is not forgotten
