"""The race-free core: what a write compares, and what a lost race turns into."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.errors import BadRecord, ConflictError, NotFound, PlacementRefused, RequestError
from allocator.placement.choose import Request
from allocator.store import MAX_TXN_OPS, Compare, Op, Read, Store, TxnOutcome

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)


class Interloper:
    """A store that lets another operator write just before our transaction, ``times`` times."""

    def __init__(self, store: Store, sneak: Allocator, times: int) -> None:
        self._store = store
        self._sneak = sneak
        self.times = times
        self.txns = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def before_write(self) -> None:
        self.txns += 1
        if self.times > 0:
            self.times -= 1
            job = f"sneaky{self.times}"
            self._sneak.assign(Request(job=job, host="node1", gpus=(self.times + 10,)))

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        self.before_write()
        return self._store.txn(compares, ops)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        self.before_write()
        return self._store.txn_or_read(compares, ops, reads)


def _allocator(store: object, actor: str = "alice@h") -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor=actor)  # type: ignore[arg-type]


def test_a_lost_race_is_retried_and_then_refused_naming_the_winner(store: Store) -> None:
    alice, bob = _allocator(store), _allocator(store, "bob@h")
    alice.apply_policy(EXAMPLE.replace("gpus: 4", "gpus: 16", 1), "p.yaml")

    class Winner(Interloper):
        def before_write(self) -> None:
            if self.txns == 0:
                bob.assign(Request(job="bobs", host="node1", gpus=(1,)))
            self.txns += 1

    racing = _allocator(Winner(store, bob, 0))
    with pytest.raises(PlacementRefused, match="held by job 'bobs'"):
        racing.assign(Request(job="alices", host="node1", gpus=(1,)))
    assert set(alice.host("node1").assignments) == {"bobs"}


def test_unrelated_writes_on_the_host_only_cost_a_retry(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE.replace("gpus: 4", "gpus: 16", 1), "p.yaml")
    interloper = Interloper(store, _allocator(store, "bob@h"), times=2)
    held, _ = _allocator(interloper).assign(Request(job="alices", host="node1", gpus=(1,)))
    assert held.gpus == (1,) and interloper.txns == 3
    assert set(alice.host("node1").assignments) == {"alices", "sneaky0", "sneaky1"}


def test_a_store_that_keeps_changing_is_a_conflict_after_bounded_attempts(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE.replace("gpus: 4", "gpus: 16", 1), "p.yaml")
    interloper = Interloper(store, _allocator(store, "bob@h"), times=5)
    with pytest.raises(ConflictError, match="changed under us 5 times"):
        _allocator(interloper).assign(Request(job="alices", host="node1", gpus=(1,)))
    assert "alices" not in alice.host("node1").assignments


def test_assignments_record_who_and_when_and_release_removes_them(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE, "p.yaml")
    held, _ = alice.assign(Request(job="train", host="node1", count=2), reason="r")
    assert held.host == "node1" and held.gpus == (0, 1)  # GPU 3 is reserved for eval-*
    assert held.updated_by == "alice@h" and held.updated_at == "2026-06-01T00:00:00Z"
    assert held.requested == "count=2" and held.reason == "r"
    assert alice.release(held.host, "train") == held
    with pytest.raises(NotFound, match="job 'train' holds nothing on host 'node1'"):
        alice.release(held.host, "train")


def test_ad_hoc_commands_need_the_policy_to_allow_them(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE, "p.yaml")
    with pytest.raises(RequestError, match="ad-hoc"):
        alice.assign(Request(job="train", host="node1", gpus=(0,)), command=("sh",))
    with pytest.raises(RequestError, match="not declared"):
        alice.assign(Request(job="nobody", host="node1", gpus=(0,)), command=("sh",))


def test_applying_the_same_policy_twice_changes_nothing(store: Store) -> None:
    alice = _allocator(store)
    first = alice.apply_policy(EXAMPLE, "p.yaml")
    again = alice.apply_policy(EXAMPLE, "p.yaml")
    assert first.changed and not again.changed and again.revision == first.revision


# A policy that takes node1's GPU 1 away from every job but eval-*.
GPU1_RESERVED = EXAMPLE.replace("gpus: [3]", "gpus: [1, 3]", 1)


class SetDuringCheck:
    """A store on which another operator's `set` commits while apply checks assignments."""

    def __init__(self, store: Store, sneak: Allocator, times: int = 1) -> None:
        self._store = store
        self._sneak = sneak
        self.times = times

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def list(self, prefix: str) -> object:
        listing = self._store.list(prefix)
        if self.times > 0:  # apply has just read the assignments it checks
            self.times -= 1
            self._sneak.assign(Request(job="train", host="node1", gpus=(1,)))
        return listing

    def read_many(self, reads: Sequence[Read]) -> object:
        found = self._store.read_many(reads)
        if any(read.key.startswith("/allocator/v1/hosts/") for read in reads):
            self.list("/allocator/v1/hosts/")  # apply has read the hosts it checks
        return found


def test_apply_never_lands_over_an_assignment_made_while_it_checked(store: Store) -> None:
    alice, bob = _allocator(store), _allocator(store, "bob@h")
    alice.apply_policy(EXAMPLE, "p.yaml")
    before = store.get(alice.layout.policy)

    racing = _allocator(SetDuringCheck(store, bob))
    with pytest.raises(PlacementRefused, match="train@node1"):
        racing.apply_policy(GPU1_RESERVED, "new.yaml")

    assert store.get(alice.layout.policy) == before  # the old policy stays applied
    assert alice.host("node1").assignments["train"].gpus == (1,)


def test_apply_keeps_losing_to_assignments_is_a_conflict_after_bounded_attempts(
    store: Store,
) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE, "p.yaml")

    class Churn(SetDuringCheck):
        def list(self, prefix: str) -> object:
            listing = self._store.list(prefix)
            job = f"sneaky{self.times}"
            self.times += 1
            self._sneak.assign(Request(job=job, host="node2", gpus=(self.times % 8,)))
            self._sneak.release("node2", job)
            return listing

    with pytest.raises(ConflictError, match="changed under us 5 times"):
        _allocator(Churn(store, _allocator(store, "bob@h"), 0)).apply_policy(
            GPU1_RESERVED, "new.yaml"
        )


def test_release_removes_a_damaged_assignment_record(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(EXAMPLE, "p.yaml")
    key = alice.layout.assignment("node1", "train")
    store.put(key, b"{not json")

    removed = alice.release("node1", "train")

    assert isinstance(removed, BadRecord) and removed.key == key
    assert store.get(key) is None
    with pytest.raises(NotFound):
        alice.release("node1", "train")


class CountingTxns:
    """A store that records the size of every transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.sizes: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        self.sizes.append(len(compares) + len(ops))
        return self._store.txn(compares, ops)

    def txn_or_read(
        self, compares: Sequence[Compare], ops: Sequence[Op], reads: Sequence[Read]
    ) -> TxnOutcome:
        self.sizes.append(len(compares) + len(ops))
        return self._store.txn_or_read(compares, ops, reads)


def test_every_transaction_fits_the_smallest_backend_limit(store: Store) -> None:
    counting = CountingTxns(store)
    alice = _allocator(counting)
    alice.apply_policy(EXAMPLE, "p.yaml")
    alice.assign(Request(job="train", host="node1", count=2))
    alice.release("node1", "train")
    alice.apply_policy(GPU1_RESERVED, "p2.yaml")

    assert len(counting.sizes) == 4
    assert max(counting.sizes) <= MAX_TXN_OPS
