"""One job across several hosts: set and release as one transaction, all hosts or none."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from allocator.control.across_hosts import (
    FIXED_OPS,
    MAX_JOB_HOSTS,
    OPS_PER_HOST,
    RESERVED_OPS_PER_HOST,
)
from allocator.control.client import Allocator
from allocator.control.job_index import read_index
from allocator.errors import ConflictError, PlacementRefused, RequestError
from allocator.history.stream import host_stream, read_stream
from allocator.placement.choose import Request
from allocator.placement.ports import first_free_port
from allocator.placement.worker_env import default_master_port
from allocator.records.types import Assignment, JobIndex, WorkerRecord
from allocator.store import MAX_TXN_OPS, Compare, Op, Store

NOW = datetime(2026, 6, 1, tzinfo=UTC)
HOSTS = 14  # more than one job may span


def policy_text(*, fallback: str = "wait", port: str = "") -> str:
    """node0..node13 with 4 GPUs each; jobs train (per-gpu) and other."""
    hosts = "".join(f"  node{i}: {{gpus: 4}}\n" for i in range(HOSTS))
    env = f"    env: {{MASTER_PORT: '{port}'}}\n" if port else ""
    return (
        f"version: 1\nhosts:\n{hosts}"
        "jobs:\n"
        f"  train:\n    command: [python, train.py]\n    workers: per-gpu\n"
        f"    fallback: {fallback}\n{env}"
        "  other:\n    command: [python, other.py]\n    workers: per-gpu\n"
        "fallback:\n  wait: {action: wait}\n  cpu: {action: cpu, threads: 2}\n"
    )


def _no_bad(bad: object) -> None:
    raise AssertionError(f"a bad record: {bad}")


class Recording:
    """A store recording every transaction; a rival writes before the first ``times`` of them."""

    def __init__(self, store: Store, rival: Allocator | None = None, times: int = 0) -> None:
        self._store = store
        self.rival = rival
        self.times = times
        self.txns: list[tuple[list[Compare], list[Op]]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
        self.txns.append((list(compares), list(ops)))
        if self.rival is not None and self.times > 0:
            self.times -= 1
            self.rival.assign(Request(job="rival", host="node2", gpus=(3,)))
            self.rival.release("node2", "rival")
        return self._store.txn(compares, ops)


def _allocator(store: object, actor: str = "alice@h") -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor=actor)  # type: ignore[arg-type]


@pytest.fixture
def alice(store: Store) -> Allocator:
    allocator = _allocator(store)
    allocator.apply_policy(policy_text(), "p.yaml")
    return allocator


def _train(count: int = 2) -> Request:
    return Request(job="train", host="", count=count)


def test_a_set_across_hosts_gives_every_host_its_share_with_one_port_and_node_ranks(
    alice: Allocator,
) -> None:
    result = alice.assign_across(_train(), ["node2", "node0"], reason="big run")
    assert result.nodes == ("node2", "node0")
    shares = {a.host: a for a in alice.find_job("train")}
    assert [shares[h].node_rank for h in ("node2", "node0")] == [0, 1]
    assert {(a.gpus, a.nodes, a.master_port, a.reason) for a in shares.values()} == {
        ((0, 1), ("node2", "node0"), result.master_port, "big run")
    }
    index = read_index(alice.store, alice.layout, "train", lambda bad: None)
    assert (index.hosts, index.nodes, index.master_port) == (
        ("node0", "node2"),
        ("node2", "node0"),
        result.master_port,
    )


def test_a_set_across_hosts_writes_nothing_when_one_host_refuses(alice: Allocator) -> None:
    alice.assign(Request(job="other", host="node1", gpus=(0, 1, 2)))
    with pytest.raises(PlacementRefused, match="node1"):
        alice.assign_across(_train(), ["node0", "node1"])
    assert alice.find_job("train") == []
    assert alice.store.get(alice.layout.job_index("train")) is None


def test_a_set_across_hosts_is_one_transaction_comparing_every_hosts_generation(
    store: Store,
) -> None:
    recording = Recording(store)
    alice = _allocator(recording)
    alice.apply_policy(policy_text(), "p.yaml")
    alice.assign_across(_train(), ["node0", "node1", "node2"])
    compares, ops = recording.txns[-1]
    compared = {c.key for c in compares}
    assert {alice.layout.host_generation(f"node{i}") for i in range(3)} <= compared
    assert {alice.layout.policy, alice.layout.job_index("train")} <= compared
    written = {op.key for op in ops}
    assert {alice.layout.assignment(f"node{i}", "train") for i in range(3)} <= written


def test_a_rival_change_on_one_host_makes_the_whole_set_retry_then_conflict(
    store: Store,
) -> None:
    alice = _allocator(store)
    alice.apply_policy(policy_text(), "p.yaml")
    racing = _allocator(Recording(store, _allocator(store, "bob@h"), times=5))
    with pytest.raises(ConflictError, match="changed under us 5 times"):
        racing.assign_across(_train(), ["node0", "node2"])
    assert alice.find_job("train") == []  # not even on node0, which nobody touched


def test_one_host_that_can_give_only_the_cpu_puts_the_whole_job_on_cpu(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(policy_text(fallback="cpu"), "p.yaml")
    alice.assign(Request(job="other", host="node1", gpus=(0, 1, 2)))
    result = alice.assign_across(_train(), ["node0", "node1"])
    assert {(a.mode, a.gpus) for a in result.assignments} == {("cpu", ())}
    assert all(
        a.fallback_reason and a.fallback_reason.startswith("node1: ") for a in result.assignments
    )


def test_moving_a_job_across_hosts_releases_the_hosts_it_leaves_in_the_same_write(
    alice: Allocator,
) -> None:
    alice.assign_across(_train(), ["node0", "node1"])
    result = alice.assign_across(_train(1), ["node1", "node2"])
    assert result.released == ("node0",)
    assert {a.host for a in alice.find_job("train")} == {"node1", "node2"}
    assert "train" not in alice.host("node0").assignments


def test_a_share_of_a_job_across_hosts_cannot_be_changed_or_released_alone(
    alice: Allocator,
) -> None:
    alice.assign_across(_train(), ["node0", "node1"])
    with pytest.raises(RequestError, match="host=node0,node1"):
        alice.assign(Request(job="train", host="node1", count=1))
    with pytest.raises(RequestError, match="release all of it"):
        alice.release("node1", "train")
    assert len(alice.find_job("train")) == 2


def test_release_across_removes_every_share_and_the_index_in_one_write(store: Store) -> None:
    recording = Recording(store)
    alice = _allocator(recording)
    alice.apply_policy(policy_text(), "p.yaml")
    alice.assign_across(_train(), ["node0", "node1"])
    store.put(alice.layout.assignment("node1", "train"), b"{damaged")
    before = len(recording.txns)
    result = alice.release_across("train")
    assert len(recording.txns) == before + 1
    assert result.damaged == ("node1",) and [a.host for a in result.assignments] == ["node0"]
    assert alice.find_job("train") == []
    assert store.get(alice.layout.assignment("node1", "train")) is None
    assert store.get(alice.layout.job_index("train")) is None


def test_master_port_avoids_ports_in_use_on_the_first_host_and_stays_put(
    alice: Allocator,
) -> None:
    first = alice.assign_across(_train(), ["node0", "node1"]).master_port
    assert first == default_master_port("train")
    alice.release_across("train")
    # node0's agent gave job "solo" that very port; job "other", across node0 and
    # node3, listens on the next one on node0.
    record = WorkerRecord(job="solo", host="node0", state="running", master_port=first)
    alice.store.put(alice.layout.workers("node0", "solo"), record.to_json())
    other = Assignment(
        job="other",
        host="node0",
        gpus=(3,),
        mode="gpu",
        updated_by="bob",
        updated_at="then",
        nodes=("node0", "node3"),
        master_port=first + 1,
    )
    alice.store.put(alice.layout.assignment("node0", "other"), other.to_json())
    again = alice.assign_across(_train(), ["node0", "node1"]).master_port
    assert again == first_free_port(first, {first, first + 1})
    moved = alice.assign_across(_train(1), ["node0", "node1"]).master_port
    assert moved == again  # the job keeps its port while its first host stays


def test_a_master_port_the_job_declares_wins(store: Store) -> None:
    alice = _allocator(store)
    alice.apply_policy(policy_text(port="29500"), "p.yaml")
    assert alice.assign_across(_train(), ["node0", "node1"]).master_port == 29500


def test_more_hosts_than_one_transaction_holds_are_refused_before_anything_is_read(
    alice: Allocator,
) -> None:
    hosts = [f"node{i}" for i in range(MAX_JOB_HOSTS + 1)]
    with pytest.raises(RequestError, match=f"at most {MAX_JOB_HOSTS}"):
        alice.assign_across(_train(), hosts)


def test_the_largest_job_with_its_history_fits_one_transaction(store: Store) -> None:
    recording = Recording(store)
    alice = _allocator(recording)
    # One history entry per host: every later change also drops the oldest one.
    alice.apply_policy(policy_text() + "history: {entries_per_host: 1}\n", "p.yaml")
    hosts = [f"node{i}" for i in range(MAX_JOB_HOSTS)]
    alice.assign_across(_train(1), hosts)
    alice.assign_across(_train(2), hosts)
    alice.release_across("train")
    sizes = [len(c) + len(o) for c, o in recording.txns[1:]]
    assert max(sizes) == FIXED_OPS + (OPS_PER_HOST + RESERVED_OPS_PER_HOST) * MAX_JOB_HOSTS
    assert max(sizes) <= MAX_TXN_OPS
    kept = [read_stream(store, host_stream(alice.layout, h), _no_bad) for h in hosts]
    assert [[e.entry.action for e in entries] for entries in kept] == [["release"]] * len(hosts)


def test_a_job_across_hosts_needs_distinct_hosts(alice: Allocator) -> None:
    with pytest.raises(RequestError, match="listed twice"):
        alice.assign_across(_train(), ["node0", "node0"])
    with pytest.raises(RequestError, match="two or more"):
        alice.assign_across(_train(), ["node0"])


def test_an_index_rebuilt_from_the_hosts_keeps_the_jobs_nodes(alice: Allocator) -> None:
    alice.assign_across(_train(), ["node1", "node0"])
    alice.store.delete(alice.layout.job_index("train"))  # a store from before the index
    with pytest.raises(RequestError, match="runs across node1,node0"):
        alice.release("node0", "train")
    assert [a.host for a in alice.find_job("train")] == ["node1", "node0"]


def test_an_index_naming_nodes_without_a_port_is_a_bad_record() -> None:
    from allocator.errors import BadRecord
    from allocator.records.codec import decode_record

    raw = JobIndex("train", ("a", "b"), ("a", "b"), 20000).to_json()
    with pytest.raises(BadRecord, match="master_port"):
        decode_record(raw.replace(b"20000", b"null"), JobIndex, "k", job="train")


def test_every_share_of_a_set_and_a_release_across_hosts_is_in_its_hosts_history(
    alice: Allocator, store: Store
) -> None:
    alice.assign_across(_train(), ["node1", "node0"], reason="sweep 7")
    alice.release_across("train", reason="sweep done")
    for host in ("node0", "node1"):
        kept = read_stream(store, host_stream(alice.layout, host), _no_bad)
        assert [(e.entry.action, e.entry.reason, e.entry.by) for e in kept] == [
            ("set", "sweep 7", "alice@h"),
            ("release", "sweep done", "alice@h"),
        ]
        assert kept[0].entry.to_gpus == (0, 1) and kept[1].entry.from_gpus == (0, 1)


def test_release_across_writes_one_usage_row_key_for_every_host_it_ends(store: Store) -> None:
    from allocator.history.rollup import read_rollup, usage_prefix

    alice = _allocator(store)
    alice.apply_policy(policy_text(), "p.yaml")
    alice.assign_across(_train(), ["node0", "node1"])
    alice.release_across("train")
    (key,) = store.list(usage_prefix(alice.layout.history)).items
    store.put(f"{usage_prefix(alice.layout.history)}complete", b"{}")
    rows = read_rollup(store, alice.layout.history, NOW, NOW, lambda bad: None)
    assert rows is not None and sorted((r[0], r[1]) for r in rows) == [
        ("node0", "train"),
        ("node1", "train"),
    ], key
