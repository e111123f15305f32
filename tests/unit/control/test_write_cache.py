"""Assignments decided from the view the last write left: one request, never a double grant."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.errors import BadRecord, PlacementRefused, RequestError
from allocator.history.append import prepare_append
from allocator.history.stream import host_stream, read_stream
from allocator.placement.choose import Request
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import AgentRecord, Assignment, HistoryEntry
from allocator.store import Compare, Op, Put, Read, Store, TxnOutcome, open_store

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
SIXTEEN = EXAMPLE.replace("gpus: 4", "gpus: 16", 1)
NOW = datetime(2026, 6, 1, tzinfo=UTC)


class Counting:
    """A store that counts the requests an allocator makes, by kind."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def get(self, key: str) -> object:
        self.calls.append("get")
        return self._store.get(key)

    def list(self, prefix: str) -> object:
        self.calls.append("list")
        return self._store.list(prefix)

    def read_many(self, reads: Sequence[Read]) -> object:
        self.calls.append("read_many")
        return self._store.read_many(reads)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        outcome = self._store.txn_or_read(compares, ops, reads)
        self.calls.append("write" if outcome.succeeded else "lost")
        return outcome


@pytest.fixture
def store() -> Store:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    _client(store, "ops@h").apply_policy(SIXTEEN, "p.yaml")
    return store


def _client(store: object, actor: str) -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor=actor)  # type: ignore[arg-type]


def _set(client: Allocator, job: str, gpu: int) -> None:
    client.assign(Request(job=job, host="node1", gpus=(gpu,)))


def test_a_cold_assignment_reads_once_and_writes_once(store: Store) -> None:
    _set(_client(store, "bob@h"), "a", 0)  # the job has an index entry, the host a history
    counting = Counting(store)
    _set(_client(counting, "alice@h"), "a", 1)
    assert counting.calls == ["read_many", "write"]


def test_a_warm_assignment_is_one_request(store: Store) -> None:
    counting = Counting(store)
    alice = _client(counting, "alice@h")
    _set(alice, "a", 0)
    counting.calls.clear()

    _set(alice, "a", 1)
    _set(alice, "a", 2)

    assert counting.calls == ["write", "write"]
    assert _client(store, "x@h").host("node1").assignments["a"].gpus == (2,)


def test_a_stale_kept_view_loses_its_compare_and_retries_from_the_state_it_brought_back(
    store: Store,
) -> None:
    counting = Counting(store)
    alice, bob = _client(counting, "alice@h"), _client(store, "bob@h")
    _set(alice, "a", 0)
    _set(bob, "b", 1)  # alice's kept view of node1 is now stale
    counting.calls.clear()

    _set(alice, "a", 2)

    assert counting.calls == ["lost", "write"]  # no extra read: the loss carried the state
    held = _client(store, "x@h").host("node1").assignments
    assert {job: a.gpus for job, a in held.items()} == {"a": (2,), "b": (1,)}


def test_a_kept_view_never_lets_two_clients_place_on_one_gpu(store: Store) -> None:
    alice, bob = _client(store, "alice@h"), _client(store, "bob@h")
    _set(alice, "a", 0)
    _set(bob, "b", 1)  # both now keep a view of node1; bob's is newer
    _set(bob, "b", 4)

    with pytest.raises(PlacementRefused, match="held by job 'b'"):
        _set(alice, "a", 4)  # alice's view still shows GPU 4 free

    held = _client(store, "x@h").host("node1").assignments
    assert {job: a.gpus for job, a in held.items()} == {"a": (0,), "b": (4,)}


def test_a_policy_applied_between_two_assignments_is_seen_by_the_next_one(
    store: Store,
) -> None:
    alice = _client(store, "alice@h")
    _set(alice, "train", 0)
    applied = _client(store, "ops@h").apply_policy(
        SIXTEEN.replace("gpus: [3]", "gpus: [1, 3]", 1), "reserved.yaml"
    )

    with pytest.raises(PlacementRefused, match="reserved"):
        _set(alice, "train", 1)  # GPU 1 is reserved for eval-* by the new policy
    held, _ = alice.assign(Request(job="train", host="node1", gpus=(2,)))

    assert held.policy_revision == applied.revision


def test_a_policy_removed_after_an_assignment_stops_the_next_one(store: Store) -> None:
    alice = _client(store, "alice@h")
    _set(alice, "train", 0)
    store.delete(alice.layout.policy)

    with pytest.raises(RequestError, match="no policy applied"):
        _set(alice, "train", 1)


def test_an_agent_record_published_after_an_assignment_is_checked_by_the_next_one(
    store: Store,
) -> None:
    alice = _client(store, "alice@h")
    _set(alice, "train", 0)
    gpus = tuple(GpuInfo(index=i, uuid=f"GPU-{i:04x}") for i in range(2))
    store.put(alice.layout.agent("node1"), AgentRecord(host="node1", gpus=gpus).to_json())

    with pytest.raises((PlacementRefused, RequestError), match="5"):
        _set(alice, "train", 5)  # the agent says node1 has GPUs 0 and 1 only

    assert _client(store, "x@h").host("node1").assignments["train"].gpus == (0,)


def _no_bad_record(bad: BadRecord) -> None:
    raise bad


# A single-host write compares both the host's generation and its history head.
# Each test below races a write that moves only one of the two keys.


def test_an_assignment_written_without_history_makes_a_kept_view_lose_its_compare(
    store: Store,
) -> None:
    alice = _client(store, "alice@h")
    _set(alice, "a", 0)
    # A writer that bumps the generation, as every assignment writer must, but keeps no
    # history of its own (a repair tool restoring a record): only the generation moves.
    restored = Assignment(
        job="b", host="node1", gpus=(4,), mode="gpu", updated_by="restore@h", updated_at="x"
    )
    layout = alice.layout
    store.txn(
        [],
        [
            Put(layout.assignment("node1", "b"), restored.to_json()),
            Put(layout.host_generation("node1"), b"restored"),
        ],
    )

    with pytest.raises(PlacementRefused, match="held by job 'b'"):
        _set(alice, "a", 4)  # alice's kept view still shows GPU 4 free

    held = _client(store, "x@h").host("node1").assignments
    assert {job: a.gpus for job, a in held.items()} == {"a": (0,), "b": (4,)}


def test_an_entry_the_agent_appended_meanwhile_is_kept_not_overwritten(store: Store) -> None:
    alice = _client(store, "alice@h")
    _set(alice, "a", 0)
    # The agent appends its decisions (a fallback, a recovery) to the host's history:
    # the head moves, the generation does not (no assignment changed).
    stream = host_stream(alice.layout, "node1")
    fallback = HistoryEntry(
        seq=0, at="2026-06-01T00:00:01Z", by="agent@node1", action="fallback", host="node1"
    )
    compare, ops = prepare_append(store, stream, fallback, None, _no_bad_record)
    store.txn([compare], ops)

    _set(alice, "a", 1)  # decided from the view kept since the first set

    entries = [
        (s.entry.seq, s.entry.action, s.entry.by)
        for s in read_stream(store, stream, _no_bad_record)
    ]
    assert entries == [
        (0, "set", "alice@h"),
        (1, "fallback", "agent@node1"),
        (2, "move", "alice@h"),
    ]
