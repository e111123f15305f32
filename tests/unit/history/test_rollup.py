"""The usage rollup counts what history counted: the old fold of history is the oracle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.agent.sync.run_expiry import expiry_entry
from allocator.history.backfill import backfill_rows
from allocator.history.entries import change_entry, release_entry
from allocator.history.prune import prune_history
from allocator.history.rollup import (
    compactions,
    day_prefix,
    marker_key,
    read_rollup,
    rollup_ops,
    rows_of,
    stale_days,
)
from allocator.history.stream import Stored
from allocator.history.usage import Holding, holdings, summarize
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment, HistoryEntry, RunHolder
from allocator.store import Put
from allocator.store.memory import MemoryStore

T0 = datetime(2026, 6, 1, 22, tzinfo=UTC)
HISTORY = "/allocator/v1/history/"

#: One step: (host, job, action, gpus, slots, holder, minutes since the last step).
_step = st.tuples(
    st.sampled_from(["n1", "n2"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["set", "release", "expired"]),
    st.sampled_from([(0,), (0, 1), (2, 3, 4)]),
    st.integers(1, 3),
    st.sampled_from(["alice", "bob"]),
    st.integers(0, 600),
)


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


Step = tuple[str, str, str, tuple[int, ...], int, str, int]
Totals = dict[str, tuple[float, float, int]]


def _play(steps: list[Step]) -> tuple[list[Stored], dict[tuple[str, str], Assignment], datetime]:
    """History entries of ``steps`` (as the writers build them), the assignments left, and now."""
    held: dict[tuple[str, str], Assignment] = {}
    entries: list[Stored] = []
    now = T0
    for host, job, action, gpus, slots, holder, minutes in steps:
        now += timedelta(minutes=minutes)
        before = held.get((host, job))
        entry: HistoryEntry | None
        if action == "set":
            after = Assignment(
                job=job,
                host=host,
                gpus=gpus,
                mode="gpu",
                slots=slots,
                updated_by=f"{holder}@x",
                updated_at=_at(now),
                holder=holder,
                run=RunHolder(pid=1),
            )
            entry = change_entry(before, after, f"{holder}@x", _at(now), "")
            held[(host, job)] = after
        elif before is None:
            continue
        elif action == "release":
            entry = release_entry(host, job, held.pop((host, job)), f"{holder}@x", _at(now), "")
        else:
            entry = expiry_entry(held.pop((host, job)), host, now)
        entries.append(Stored(msgspec.structs.replace(entry, seq=len(entries)), len(entries) + 1))
    return entries, held, now + timedelta(minutes=30)


def _totals(found: list[Holding], since: datetime, until: datetime) -> Totals:
    rows = summarize(found, "job", since, until, lambda h: (f"{h.host}/{h.job}/{h.holder}",))
    return {r.key: (round(r.gpu_hours, 6), round(r.slot_hours, 6), r.holdings) for r in rows}


def _rolled(
    entries: list[Stored],
    current: dict[tuple[str, str], Assignment],
    since: datetime,
    now: datetime,
    compact: bool = False,
) -> list[Holding]:
    store = MemoryStore()
    store.put(marker_key(HISTORY), b"{}")
    for stored in entries:
        key = f"{HISTORY}hosts/{stored.entry.host}/{stored.entry.seq:012d}"
        store.txn([], rollup_ops(HISTORY, key, rows_of([stored.entry])))
    if compact:  # as prune merges the days' keys: the same count from fewer keys
        for day in {kv.key.split("/")[6] for kv in store.list(f"{HISTORY}usage/days/").items}:
            listing = store.list(f"{HISTORY}usage/days/{day}/").items
            for compares, ops in compactions(HISTORY, listing):
                store.txn(compares, ops)
    ended = read_rollup(store, HISTORY, since, now, lambda bad: None)
    assert ended is not None
    return [_holding(row) for row in ended] + holdings([], current, now)


def _holding(row: tuple[str, str, str, int, int, float, float]) -> Holding:
    host, job, holder, gpus, slots, start, end = row
    begun, ended = datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC)
    return Holding(host, job, holder, gpus, slots, begun, ended)


@settings(max_examples=150, deadline=None)
@given(st.lists(_step, max_size=30), st.integers(0, 3000), st.booleans())
def test_the_rollup_counts_what_the_history_fold_counted(
    steps: list[Step], back: int, compact: bool
) -> None:
    entries, current, now = _play(steps)
    since = now - timedelta(minutes=back)
    oracle = _totals(holdings(entries, current, now), since, now)
    assert _totals(_rolled(entries, current, since, now, compact), since, now) == oracle


@settings(max_examples=60, deadline=None)
@given(st.lists(_step, max_size=20))
def test_the_backfill_of_old_entries_counts_what_history_counted(steps: list[Step]) -> None:
    entries, current, now = _play(steps)
    unrolled = {"started": None, "from_slots": None, "from_holder": None}
    old = [Stored(msgspec.structs.replace(s.entry, **unrolled), s.revision) for s in entries]
    assert rows_of(s.entry for s in old) == []  # entries of an older version write no row
    rows = backfill_rows(old, now)
    found = [_holding(row) for row in rows] + holdings([], current, now)
    since = T0 - timedelta(days=1)
    assert _totals(found, since, now) == _totals(holdings(old, current, now), since, now)
    assert backfill_rows(entries, now) == []  # every end wrote its own row: nothing to add


def test_a_holding_is_filed_by_the_day_it_ended_and_clipped_to_the_window() -> None:
    held = Assignment(
        job="a",
        host="n1",
        gpus=(0, 1),
        mode="gpu",
        updated_by="alice@x",
        updated_at=_at(T0),
        holder="alice",
    )
    end = T0 + timedelta(hours=4)  # past midnight: filed on the next day
    (put,) = rollup_ops(
        HISTORY,
        f"{HISTORY}hosts/n1/000000000001",
        rows_of([release_entry("n1", "a", held, "alice@x", _at(end), "")]),
    )
    assert isinstance(put, Put) and put.key.startswith(day_prefix(HISTORY, end))
    store = MemoryStore()
    store.txn([], [put, Put(marker_key(HISTORY), b"{}")])
    since = T0 + timedelta(hours=3)
    found = read_rollup(store, HISTORY, since, end, lambda bad: None)
    assert found is not None
    assert _totals([_holding(r) for r in found], since, end) == {"n1/a/alice": (2.0, 2.0, 1)}
    assert read_rollup(MemoryStore(), HISTORY, since, end, lambda bad: None) is None


def test_prune_drops_only_days_wholly_before_the_cutoff() -> None:
    store = MemoryStore()
    for day in (1, 2, 3):
        store.put(f"{HISTORY}usage/days/2026-06-0{day}/hosts/n1/000000000001", b"[]")
    for delete in stale_days(HISTORY, datetime(2026, 6, 3, 5, tzinfo=UTC)):
        store.txn([], [delete])
    left = [kv.key.split("/")[-4] for kv in store.list(f"{HISTORY}usage/").items]
    assert left == ["2026-06-03"]


def test_prune_merges_a_past_days_row_keys_and_the_count_stays() -> None:
    store = MemoryStore()
    store.put(marker_key(HISTORY), b"{}")
    ends = [T0 + timedelta(minutes=n) for n in range(70)]
    for n, end in enumerate(ends):
        row = ("n1", f"j{n}", "alice", 2, 1, end.timestamp() - 60, end.timestamp())
        store.txn([], rollup_ops(HISTORY, f"{HISTORY}hosts/n1/{n:012d}", [row]))
    since, until = T0 - timedelta(days=1), T0 + timedelta(days=1)
    before = read_rollup(store, HISTORY, since, until, lambda bad: None)
    prune_history(store, KeyLayout(), frozenset({"n1"}), 86_400 * 30, until, lambda bad: None)
    after = read_rollup(store, HISTORY, since, until, lambda bad: None)
    assert before is not None and after is not None and sorted(after) == sorted(before)
    assert len(store.list(f"{HISTORY}usage/days/").items) == 1  # 30 + 30 + 10, then merged
