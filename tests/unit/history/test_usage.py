"""GPU-hours from history: holdings begin at a set or move and end at the next move or release."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from allocator.history.stream import Stored
from allocator.history.usage import (
    Holding,
    holder_of,
    holdings,
    open_spans,
    span_of,
    summarize,
    summarize_spans,
)
from allocator.records.types import Assignment, HistoryEntry

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
    group = {"job": lambda h: (h.job,), "user": lambda h: (h.holder,)}[key]
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
        found, "job", T0 + timedelta(hours=8), T0 + timedelta(days=1), lambda h: (h.job,)
    )
    assert (row.gpu_hours, row.slot_hours) == (4.0, 8.0)


def test_the_holder_is_the_recorded_holder_else_the_writers_user() -> None:
    assert holder_of(_entry("set", "a", 0, (0,), by="bob@node2").entry) == "bob"
    entries = [_entry("set", "a", 0, (0,), by="bob@x"), _entry("set", "b", 0, (1,), by="carol@y"),
               _entry("release", "a", 1), _entry("release", "b", 2)]  # fmt: skip
    assert _by(holdings(entries, {}), "user", T0, T0 + timedelta(days=1)) == {
        "bob": 1.0,
        "carol": 2.0,
    }
    # An operator's set for alice: the recorded holder wins over who wrote it.
    assert holder_of(_entry("set", "a", 0, (0,), by="ops@node2", holder="alice").entry) == "alice"


def test_set_and_release_entries_record_the_assignments_holder() -> None:
    from allocator.history.entries import change_entry, release_entry
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


def _held(job: str, gpus: tuple[int, ...], at: float, holder: str = "alice") -> Assignment:
    when = (T0 + timedelta(hours=at)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return Assignment(job=job, host="node1", gpus=gpus, mode="gpu", updated_by=f"{holder}@x",
                      updated_at=when, holder=holder)  # fmt: skip


def test_a_holding_whose_start_history_trimmed_still_counts() -> None:
    # "long" was set before the oldest entry history kept and still holds; "old" was released.
    entries = [_entry("set", "b", 10, (2,)),
               _entry("release", "old", 12, from_mode="gpu", from_gpus=(3,))]  # fmt: skip
    current = {("node1", "long"): _held("long", (0, 1), 0), ("node1", "b"): _held("b", (2,), 10)}
    found = holdings(entries, current, now=T0 + timedelta(hours=20))
    # long: its own assignment says since when (20 h x 2); old: at least since history's oldest.
    assert _by(found, "job", T0, T0 + timedelta(hours=20)) == {"long": 40.0, "b": 10.0, "old": 2.0}


def test_by_team_credits_every_team_of_the_holder_as_quotas_charge_each() -> None:
    from allocator.policy.loader import load_policy
    from allocator.status.usage_report import group_of

    policy = load_policy(
        "version: 1\nhosts: {node1: {gpus: 4}}\n"
        "teams: {vision: {members: [alice]}, speech: {members: [alice, bob]}}\n"
    )
    found = holdings([_entry("set", "a", 0, (0,), holder="alice"), _entry("release", "a", 2),
                      _entry("set", "b", 0, (1,), holder="carol"), _entry("release", "b", 1)],
                     {})  # fmt: skip
    until = T0 + timedelta(days=1)
    spans = [span_of(h, until) for h in found]
    rows = summarize_spans(spans, T0, until, group_of("team", policy))
    assert {r.key: r.gpu_hours for r in rows} == {"vision": 2.0, "speech": 2.0, "(no team)": 1.0}


def test_a_writer_whose_clock_is_off_is_bounded_by_the_store_s_order() -> None:
    """Entries the store ordered around a write bound its time, whatever its writer's clock said."""
    ahead, behind = timedelta(hours=1), -timedelta(hours=1)
    for off in (ahead, behind):
        entries = [
            _entry("set", "x", 0, (0,), by="bob@good1"),
            _entry("set", "a", 0.001 + off.total_seconds() / 3600, (0, 1), by="alice@skewed"),
            _entry("set", "y", 0.002, (2,), by="bob@good2"),
            _entry("release", "a", 0.004, by="ops@good1"),
        ]
        found = holdings(entries, {}, now=T0 + timedelta(hours=3))
        hours = {h.job: h.seconds(T0, T0 + timedelta(hours=3)) / 3600 for h in found}
        # Truly 0.003 h (entries keep whole seconds): within the neighbours', never 0 or 1 h.
        assert 0.0015 <= hours["a"] <= 0.0045, (off, hours["a"])


@given(
    held=st.lists(
        st.tuples(
            st.sampled_from(["gpu", "cpu"]),
            st.lists(st.integers(0, 7), max_size=3, unique=True),
            st.integers(-48, 48),  # hours from T0 (after ``now`` included)
            st.sampled_from(["", "bob"]),
            st.sampled_from(["alice@node1", "@node1", "carol"]),
            st.integers(1, 4),
        ),
        max_size=8,
    )
)
def test_open_spans_count_what_holdings_count_for_untracked_assignments(
    held: list[tuple[str, list[int], int, str, str, int]],
) -> None:
    now = T0 + timedelta(hours=1)
    current = {
        ("node1", f"job{n}"): Assignment(
            job=f"job{n}",
            host="node1",
            gpus=tuple(gpus) if mode == "gpu" else (),
            mode=mode,  # type: ignore[arg-type]
            updated_by=by,
            updated_at=(T0 + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            holder=holder,
            slots=slots,
        )
        for n, (mode, gpus, hours, holder, by, slots) in enumerate(held)
    }

    spans = open_spans(current.values(), now)

    assert spans == [span_of(h, now) for h in holdings([], current, now)]
    assert all(start <= end == now.timestamp() for *_, start, end in spans)
