"""Assignment history: appended with the change it records, bounded, never reusing a number."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.errors import BadRecord, CasConflict, InvalidInput
from allocator.history.append import MAX_TRIM, prepare_append
from allocator.history.stream import (
    Stored,
    host_stream,
    parse_since,
    read_history,
    read_stream,
    select,
)
from allocator.placement.choose import Request
from allocator.policy.model import HistorySettings
from allocator.records.codec import replace_struct
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Store
from tests.support.reads import no_bad

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LAYOUT = KeyLayout()


def _allocator(store: Store, limit: int | None = None) -> Allocator:
    allocator = Allocator(store, clock=lambda: NOW, actor="alice@h")
    text = EXAMPLE + (f"history: {{entries_per_host: {limit}}}\n" if limit else "")
    allocator.apply_policy(text, "p.yaml")
    return allocator


def _entries(store: Store, host: str = "node1") -> list[HistoryEntry]:
    """The host's entries, newest first."""
    found = read_history(store, LAYOUT, no_bad, host=host, with_policy=False)
    return [s.entry for s in found]


def _set(allocator: Allocator, job: str, *gpus: int, reason: str = "") -> None:
    allocator.assign(Request(job=job, host="node1", gpus=gpus), reason=reason)


def _entry(job: str = "train") -> HistoryEntry:
    return HistoryEntry(
        seq=0, at="2026-06-01T12:00:00Z", by="x", action="set", host="node1", job=job
    )


# --- what each change writes ------------------------------------------------------------


def test_set_move_and_release_each_write_one_entry_newest_first(store: Store) -> None:
    allocator = _allocator(store)
    _set(allocator, "train", 0, 1, reason="baseline")
    _set(allocator, "train", 2, reason="rebalance")
    allocator.release("node1", "train", reason="done")

    release, move, first = _entries(store)

    assert (first.action, first.from_mode, first.to_mode, first.to_gpus) == (
        "set",
        None,
        "gpu",
        (0, 1),
    )
    assert (move.action, move.from_gpus, move.to_gpus, move.reason) == (
        "move",
        (0, 1),
        (2,),
        "rebalance",
    )
    assert (release.action, release.from_gpus, release.to_mode, release.reason) == (
        "release",
        (2,),
        None,
        "done",
    )
    assert {e.by for e in (first, move, release)} == {"alice@h"}
    assert first.at == "2026-06-01T12:00:00Z"


def test_setting_a_job_again_where_it_is_is_a_set_not_a_move(store: Store) -> None:
    allocator = _allocator(store)
    _set(allocator, "train", 1)
    _set(allocator, "train", 1, reason="renewed")
    assert [e.action for e in _entries(store)] == ["set", "set"]


def test_a_count_request_and_a_move_to_cpu_say_what_was_asked(store: Store) -> None:
    allocator = _allocator(store)
    allocator.assign(Request(job="train", host="node1", count=2))
    allocator.assign(Request(job="train", host="node1", cpu=True))
    to_cpu, counted = _entries(store)
    assert counted.detail == "asked for count=2" and counted.to_gpus == (0, 1)
    assert (to_cpu.action, to_cpu.from_mode, to_cpu.to_mode, to_cpu.to_gpus) == (
        "move",
        "gpu",
        "cpu",
        (),
    )


def test_policy_apply_is_recorded_with_its_hash_and_the_one_it_replaced(store: Store) -> None:
    allocator = _allocator(store)
    first = allocator.policy()
    assert first is not None
    result = allocator.apply_policy(EXAMPLE + "\n# edited\n", "new.yaml", reason="PR 12")
    allocator.apply_policy(EXAMPLE + "\n# edited\n", "new.yaml")  # unchanged: nothing written

    entries = [s.entry for s in read_history(store, LAYOUT, no_bad)]

    assert [e.action for e in entries] == ["policy-apply", "policy-apply"]
    assert entries[0].policy_sha256 == result.record.sha256
    assert entries[0].previous_sha256 == first.record.sha256
    assert entries[0].reason == "PR 12" and entries[0].detail == "from new.yaml"
    assert entries[1].previous_sha256 is None


def test_a_failed_change_writes_no_entry(store: Store) -> None:
    allocator = _allocator(store)
    _set(allocator, "train", 1)
    with pytest.raises(Exception, match="held by job 'train'"):
        _set(allocator, "other", 1)
    assert [e.job for e in _entries(store)] == ["train"]


def test_history_lives_outside_the_host_prefix_that_set_and_status_read(store: Store) -> None:
    allocator = _allocator(store)
    for gpu in range(3):
        _set(allocator, "train", gpu)
    host_keys = [kv.key for kv in store.list(LAYOUT.host("node1")).items]
    assert not any("history" in key for key in host_keys)


# --- bounded --------------------------------------------------------------------------------


def test_a_host_keeps_its_newest_entries_up_to_the_policy_limit(store: Store) -> None:
    allocator = _allocator(store, limit=3)
    for gpu in (0, 1, 2, 0, 1):
        _set(allocator, "train", gpu)

    entries = _entries(store)

    assert [e.seq for e in entries] == [4, 3, 2]
    assert [e.to_gpus for e in entries] == [(1,), (0,), (2,)]
    assert len(store.list(LAYOUT.host_history("node1")).items) == 3


def test_a_lowered_limit_drops_a_few_old_entries_per_append_until_it_holds(store: Store) -> None:
    allocator = _allocator(store, limit=20)
    for i in range(20):
        _set(allocator, "train", i % 3)
    allocator.apply_policy(EXAMPLE + "history: {entries_per_host: 2}\n", "p.yaml")

    _set(allocator, "train", 0)
    assert len(_entries(store)) == 20 - MAX_TRIM  # one displaced, MAX_TRIM more dropped
    for i in range(5):
        _set(allocator, "train", i % 3)

    assert [e.seq for e in _entries(store)] == [25, 24]


def test_release_keeps_the_limit_the_host_history_was_written_with(store: Store) -> None:
    allocator = _allocator(store, limit=2)
    for gpu in (0, 1, 2):
        _set(allocator, "train", gpu)
    allocator.release("node1", "train")
    assert [e.action for e in _entries(store)] == ["release", "move"]


# --- sequence numbers ----------------------------------------------------------------------------


def test_two_writers_of_one_head_cannot_both_take_a_sequence_number(store: Store) -> None:
    stream = host_stream(LAYOUT, "node1")
    first = prepare_append(store, stream, _entry("a"), HistorySettings(10), no_bad)
    second = prepare_append(store, stream, _entry("b"), HistorySettings(10), no_bad)
    store.txn([first[0]], first[1])
    with pytest.raises(CasConflict):
        store.txn([second[0]], second[1])
    retried = prepare_append(store, stream, _entry("b"), HistorySettings(10), no_bad)
    store.txn([retried[0]], retried[1])
    assert [(e.seq, e.job) for e in _entries(store)] == [(1, "b"), (0, "a")]


def test_a_head_deleted_by_hand_does_not_make_the_next_entry_overwrite_one(store: Store) -> None:
    allocator = _allocator(store)
    for gpu in (0, 1):
        _set(allocator, "train", gpu)
    store.delete(LAYOUT.host_history_head("node1"))
    _set(allocator, "train", 2)
    assert [e.seq for e in _entries(store)] == [2, 1, 0]


def test_a_damaged_head_is_reported_and_rebuilt_from_the_entries(store: Store) -> None:
    allocator = _allocator(store)
    _set(allocator, "train", 0)
    store.put(LAYOUT.host_history_head("node1"), b'{"schema_version": 1, "first": "x"}')
    reported: list[BadRecord] = []
    allocator.on_bad_record = reported.append
    _set(allocator, "train", 1)
    assert [e.seq for e in _entries(store)] == [1, 0]
    assert [b.key for b in reported] == [LAYOUT.host_history_head("node1")]


def test_a_damaged_entry_is_skipped_and_reported_the_rest_still_read(store: Store) -> None:
    allocator = _allocator(store)
    for gpu in (0, 1):
        _set(allocator, "train", gpu)
    stream = host_stream(LAYOUT, "node1")
    store.put(stream.entry_key(0), b"not json")
    store.put(f"{stream.prefix}junk", b"{}")
    reported: list[BadRecord] = []

    found = read_stream(store, stream, reported.append)

    assert [s.entry.seq for s in found] == [1]
    assert sorted(b.key for b in reported) == sorted([stream.entry_key(0), f"{stream.prefix}junk"])


def test_an_entry_naming_another_host_or_seq_or_no_time_is_a_bad_record(store: Store) -> None:
    stream = host_stream(LAYOUT, "node1")
    good = _entry()
    store.put(stream.entry_key(0), replace_struct(good, host="node2").to_json())
    store.put(stream.entry_key(1), replace_struct(good, seq=7).to_json())
    store.put(stream.entry_key(2), replace_struct(good, seq=2, at="yesterday").to_json())
    store.put(stream.entry_key(3), replace_struct(good, seq=3).to_json())
    reported: list[BadRecord] = []
    assert [s.entry.seq for s in read_stream(store, stream, reported.append)] == [3]
    assert [b.key for b in reported] == [stream.entry_key(i) for i in range(3)]


# --- reading and selecting --------------------------------------------------------------------


def _stored(job: str, gpus: tuple[int, ...], at: datetime, revision: int) -> Stored:
    entry = HistoryEntry(
        seq=revision,
        at=at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        by="x",
        action="set",
        host="node1",
        job=job,
        to_mode="gpu",
        to_gpus=gpus,
    )
    return Stored(entry, revision)


def test_select_keeps_entries_of_the_job_touching_the_gpu_since_the_time() -> None:
    old = _stored("train", (1,), NOW - timedelta(hours=3), 1)
    other_job = _stored("eval", (1,), NOW, 2)
    other_gpu = _stored("train", (2,), NOW, 3)
    wanted = _stored("train", (0, 1), NOW - timedelta(minutes=5), 4)
    entries = [wanted, other_gpu, other_job, old]
    assert select(entries, job="train", gpu=1, since=NOW - timedelta(hours=1)) == [wanted]
    assert select(entries, gpu=1) == [wanted, other_job, old]


def test_every_hosts_history_is_read_newest_first_across_hosts(store: Store) -> None:
    allocator = _allocator(store)
    _set(allocator, "train", 0)
    allocator.assign(Request(job="big", host="node2", count=2))
    _set(allocator, "train", 1)
    entries = [s.entry for s in read_history(store, LAYOUT, no_bad)]
    assert [(e.host, e.action) for e in entries] == [
        ("node1", "move"),
        ("node2", "set"),
        ("node1", "set"),
        (None, "policy-apply"),
    ]


# --- --since ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "back"),
    [
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("1h30m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
    ],
)
def test_since_takes_durations_back_from_now(text: str, back: timedelta) -> None:
    assert parse_since(text, NOW) == NOW - back


def test_since_takes_an_rfc3339_time_with_its_zone() -> None:
    assert parse_since("2026-05-31T10:00:00Z", NOW) == datetime(2026, 5, 31, 10, tzinfo=UTC)
    assert parse_since("2026-05-31T12:00:00+02:00", NOW) == datetime(2026, 5, 31, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("5x", "expected a duration"),
        ("", "expected a duration"),
        ("-2h", "expected a duration"),
        ("2 h", "expected a duration"),
        ("yesterday", "expected a duration"),
        ("2026-05-31", "expected a duration"),
        ("2026-05-31T10:00:00", "time zone"),
        ("999999w", "days back"),
        ("9" * 5000 + "h", "expected a duration"),
    ],
)
def test_since_refuses_anything_else_in_one_line(text: str, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment) as caught:
        parse_since(text, NOW)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
