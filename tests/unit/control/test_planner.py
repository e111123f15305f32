"""The planner of one job's change on one host: decided from data alone, no store anywhere."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime

import msgspec
import pytest

from allocator.control.job_index import IndexEntry
from allocator.control.owners import Standing
from allocator.control.planner import PlanContext, place_request, plan_assign, plan_release
from allocator.control.quotas import OverQuota, counter_key
from allocator.control.write_cache import Planned, WriteView
from allocator.errors import ConflictError, NotFound, NotPermitted, PlacementRefused
from allocator.history.append import Head
from allocator.placement.choose import Request
from allocator.policy import load_policy
from allocator.policy.model import Policy
from allocator.records.holders import Charge, HolderCount
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry, PolicyRecord
from allocator.status.snapshots import HostSnapshot, PolicySnapshot
from allocator.store import Compare, Delete, KeyValue, Put
from allocator.util.digest import sha256_hex
from allocator.util.times import format_time

LAYOUT = KeyLayout()
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
TEXT = textwrap.dedent(
    """
    version: 1
    hosts:
      node1: {gpus: 4}
    teams:
      team-a: {members: [alice]}
    reservations:
      - {name: nightly, host: node1, gpus: [3], for: [eval-*]}
    quotas:
      - {who: user:alice, gpus: 2}
    """
).lstrip("\n")
POLICY: Policy = load_policy(TEXT, "policy.yaml")
ALICE = Standing("alice", False, (), ("user:alice",), POLICY)


def _view(*held: Assignment, policy_revision: int = 5) -> WriteView:
    record = PolicyRecord(TEXT, sha256_hex(TEXT.encode()), "op", "2026-01-01T00:00:00Z")
    state = HostSnapshot("node1", assignments={a.job: a for a in held}, generation=9)
    return WriteView(
        PolicySnapshot(POLICY, record, policy_revision),
        state,
        IndexEntry("train", None, 0),
        Head(revision=11),
    )


def _held(job: str, gpus: tuple[int, ...], holder: str = "alice") -> Assignment:
    charged = ("user:alice",) if holder == "alice" else ()
    return Assignment(
        job=job, host="node1", gpus=gpus, mode="gpu", updated_by="t",
        updated_at="2026-01-01T00:00:00Z", holder=holder, charged=charged,
    )  # fmt: skip


def _context(counters: dict[str, KeyValue | None] | None = None) -> PlanContext:
    return PlanContext(LAYOUT, "alice@h", NOW, ALICE, counters or {})


def _counter(held_gpus: int, revision: int, **more: int) -> dict[str, KeyValue | None]:
    charges = {"node1/old": held_gpus, **{f"node1/{job}": n for job, n in more.items()}}
    count = HolderCount(charges={name: Charge("", gpus=n) for name, n in charges.items()})
    key = counter_key(LAYOUT, "user:alice")
    return {"user:alice": KeyValue(key, count.to_json(), revision, revision)}


def _set(
    view: WriteView, gpus: tuple[int, ...], context: PlanContext
) -> tuple[Assignment, Planned]:
    asked = Request(job="train", host="node1", gpus=gpus)
    request, placed = place_request(view, asked, (None, None), context)
    return plan_assign(view, request, placed, "why", (None, None), context)


def test_a_set_over_the_quota_is_refused_with_over_quota() -> None:
    with pytest.raises(OverQuota, match="over quota alice 2/2 GPUs"):
        _set(_view(), (0,), _context(_counter(2, revision=7)))


def test_a_set_within_the_quota_compares_and_writes_the_counter_it_was_given() -> None:
    _, planned = _set(_view(), (0,), _context(_counter(1, revision=7)))
    key = counter_key(LAYOUT, "user:alice")
    assert Compare(key, 7) in planned.compares
    (written,) = [HolderCount.from_json(op.value) for op in _puts(planned) if op.key == key]
    assert written.charges["node1/train"] == Charge("", gpus=1)


def test_a_vanished_charge_handed_in_as_gone_makes_room_and_its_absence_is_compared() -> None:
    over = _context(_counter(2, revision=7))
    context = msgspec.structs.replace(over, gone=frozenset({"node1/old"}))
    _, planned = _set(_view(), (0,), context)
    assert Compare(LAYOUT.assignment("node1", "old"), 0) in planned.compares


def test_a_gpu_held_by_another_job_is_a_conflict_naming_it() -> None:
    with pytest.raises(ConflictError, match="other"):
        _set(_view(_held("other", (1,))), (1,), _context())


def test_a_job_someone_else_holds_is_refused_naming_the_holder() -> None:
    with pytest.raises(NotPermitted, match="held by bob"):
        _set(_view(_held("train", (0,), holder="bob")), (1,), _context())


def test_a_reserved_gpu_is_refused() -> None:
    with pytest.raises(PlacementRefused, match="nightly"):
        _set(_view(), (3,), _context())


def test_the_assignment_and_its_history_entry_are_stamped_with_the_given_time() -> None:
    assignment, planned = _set(_view(), (0, 1), _context())
    assert assignment.updated_at == format_time(NOW)
    assert (assignment.holder, assignment.charged) == ("alice", ("user:alice",))
    entries = [
        msgspec.json.decode(op.value, type=HistoryEntry)
        for op in _puts(planned)
        if op.key.startswith(LAYOUT.history) and b'"seq"' in op.value
    ]
    assert [(e.at, e.job) for e in entries] == [(format_time(NOW), "train")]
    assert Compare(LAYOUT.policy, 5) in planned.compares


def test_a_release_plan_compares_the_records_revision_and_gives_back_its_charge() -> None:
    held = _held("train", (0,))
    current, planned = plan_release(
        _view(held), "train", "done", (41, None), _context(_counter(1, revision=7, train=1))
    )
    key = LAYOUT.assignment("node1", "train")
    assert current == held
    assert Compare(key, 41) in planned.compares
    assert Delete(key) in planned.ops
    counter = counter_key(LAYOUT, "user:alice")
    assert Compare(counter, 7) in planned.compares
    (given_back,) = [op for op in _puts(planned) if op.key == counter]
    assert HolderCount.from_json(given_back.value).charges == {"node1/old": Charge("", gpus=1)}


def test_a_release_of_what_the_job_does_not_hold_is_not_found() -> None:
    with pytest.raises(NotFound, match="'train'"):
        plan_release(_view(), "train", "", (None, None), _context())


def test_a_release_of_someone_elses_job_is_refused_naming_the_holder() -> None:
    with pytest.raises(NotPermitted, match="held by bob"):
        view = _view(_held("train", (0,), holder="bob"))
        plan_release(view, "train", "", (None, None), _context())


def _puts(planned: Planned) -> list[Put]:
    return [op for op in planned.ops if isinstance(op, Put)]
