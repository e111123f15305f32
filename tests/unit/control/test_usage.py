"""GPU-hours from history: holdings begin at a set or move and end at the next move or release."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from allocator.control.history import Stored
from allocator.control.usage import Holding, holder_of, holdings, summarize
from allocator.records.types import HistoryEntry

T0 = datetime(2026, 6, 1, tzinfo=UTC)
_revision = iter(range(1, 10_000))


def _entry(
    action: str, job: str, hours: float, gpus: tuple[int, ...] = (), **more: object
) -> Stored:
    at = (T0 + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = HistoryEntry(
        seq=0,
        at=at,
        by=str(more.pop("by", "alice@node1")),
        action=action,
        host="node1",
        job=job,
        to_mode="gpu" if gpus else None,
        to_gpus=gpus,
        **more,  # type: ignore[arg-type]
    )
    return Stored(entry, next(_revision))


def _by(found: list[Holding], key: str, since: datetime, until: datetime) -> dict[str, float]:
    group = {"job": lambda h: h.job, "user": lambda h: h.holder}[key]
    return {r.key: round(r.gpu_hours, 6) for r in summarize(found, key, since, until, group)}


def test_a_set_and_its_release_count_gpus_times_hours() -> None:
    found = holdings([_entry("set", "a", 0, (0, 1)), _entry("release", "a", 3)], {})
    assert _by(found, "job", T0, T0 + timedelta(days=1)) == {"a": 6.0}


def test_a_move_ends_one_holding_and_begins_another() -> None:
    entries = [_entry("set", "a", 0, (0,)), _entry("move", "a", 1, (0, 1, 2)),
               _entry("release", "a", 2)]  # fmt: skip
    found = holdings(entries, {})
    assert _by(found, "job", T0, T0 + timedelta(days=1)) == {"a": 1.0 + 3.0}


def test_an_open_holding_counts_up_to_now_only_while_its_assignment_exists() -> None:
    entries = [_entry("set", "kept", 0, (0,)), _entry("set", "killed", 0, (1,))]
    found = holdings(entries, {("node1", "kept"): object()})
    assert _by(found, "job", T0, T0 + timedelta(hours=5)) == {"kept": 5.0}
    assert [h.job for h in found if h.ended_unrecorded] == ["killed"]


def test_only_the_window_counts_and_slots_weigh_slot_hours() -> None:
    found = holdings([_entry("set", "a", 0, (0, 1), slots=2), _entry("release", "a", 10)], {})
    (row,) = summarize(
        found, "job", T0 + timedelta(hours=8), T0 + timedelta(days=1), lambda h: h.job
    )
    assert (row.gpu_hours, row.slot_hours) == (4.0, 8.0)


def test_the_holder_is_the_recorded_holder_else_the_writers_user() -> None:
    assert holder_of(_entry("set", "a", 0, (0,), by="bob@node2").entry) == "bob"
    entries = [_entry("set", "a", 0, (0,), by="bob@x"), _entry("release", "a", 1),
               _entry("set", "b", 0, (1,), by="carol@y"), _entry("release", "b", 2)]  # fmt: skip
    assert _by(holdings(entries, {}), "user", T0, T0 + timedelta(days=1)) == {
        "bob": 1.0,
        "carol": 2.0,
    }
    # An operator's set for alice: the recorded holder wins over who wrote it.
    assert holder_of(_entry("set", "a", 0, (0,), by="ops@node2", holder="alice").entry) == "alice"


def test_set_and_release_entries_record_the_assignments_holder() -> None:
    from allocator.control.history_entries import change_entry, release_entry
    from allocator.records.types import Assignment

    held = Assignment(
        job="a", host="node1", gpus=(0,), mode="gpu", updated_by="ops@x", updated_at="t",
        holder="alice",
    )  # fmt: skip
    assert change_entry(None, held, "ops@x", "t", "").holder == "alice"
    assert release_entry("node1", "a", held, "ops@x", "t", "").holder == "alice"


def test_the_agents_expired_entry_ends_a_killed_runs_holding() -> None:
    entries = [_entry("set", "killed", 0, (0, 1)),
               _entry("expired", "killed", 2, by="agent@node1")]  # fmt: skip
    found = holdings(entries, {})
    assert _by(found, "job", T0, T0 + timedelta(hours=5)) == {"killed": 4.0}
    assert not any(h.ended_unrecorded for h in found)
