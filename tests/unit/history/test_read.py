"""History read newest first: what a limited read costs is what it shows, not the whole history."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from allocator.history.append import prepare_append
from allocator.history.read import (
    SINCE_PAGE,
    first_page,
    newest_entries,
    query_history,
)
from allocator.history.stream import (
    Stored,
    Stream,
    host_stream,
    policy_stream,
    read_history,
    select,
)
from allocator.policy.model import HistorySettings
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.serve.history import history_json
from allocator.store import Store, open_store
from allocator.util.times import format_time
from tests.support.reads import CountingStore, no_bad

LAYOUT = KeyLayout()
START = datetime(2026, 6, 1, tzinfo=UTC)


def _append(store: Store, stream: Stream, minute: int, job: str | None, gpu: int) -> None:
    at = format_time(START + timedelta(minutes=minute))
    if job is None:
        entry = HistoryEntry(seq=0, at=at, by="alice", action="policy-apply")
    else:
        entry = HistoryEntry(
            seq=0,
            at=at,
            by="alice",
            action="set",
            host=stream.host,
            job=job,
            to_mode="gpu",
            to_gpus=(gpu,),
        )
    compare, ops = prepare_append(store, stream, entry, HistorySettings(10_000), no_bad)
    store.txn([compare], ops)


@pytest.fixture
def fleet() -> Store:
    """12 hosts of 60 entries each, interleaved in time, and a few policy entries."""
    store = open_store(f"memory://{uuid.uuid4().hex}")
    minute = 0
    for round_ in range(60):
        for index in range(12):
            stream = host_stream(LAYOUT, f"node{index}")
            _append(store, stream, minute, f"job{(round_ + index) % 5}", round_ % 4)
            minute += 1
        if round_ % 20 == 0:
            _append(store, policy_stream(LAYOUT), minute, None, 0)
    return store


def _everything(store: Store, **filters: Any) -> list[Stored]:
    """What ``history`` showed before: every entry read, then selected and cut."""
    host, limit = filters.pop("host", None), filters.pop("limit", None)
    with_policy = filters.get("job") is None and filters.get("gpu") is None
    entries = read_history(store, LAYOUT, no_bad, host=host, with_policy=with_policy)
    return select(entries, **filters)[:limit]


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"limit": 1},
        {"limit": 20},
        {"limit": 500},
        {"host": "node3", "limit": 7},
        {"job": "job2", "limit": 30},
        {"gpu": 3, "limit": 9},
        {"job": "job1", "gpu": 1},
        {"since": START + timedelta(minutes=700), "limit": 4},
        {"since": START + timedelta(minutes=600)},
        {"host": "node5", "since": START + timedelta(minutes=500), "limit": 100},
    ],
)
def test_a_query_shows_what_reading_everything_showed(
    fleet: Store, filters: dict[str, Any]
) -> None:
    assert query_history(fleet, LAYOUT, no_bad, **filters) == _everything(fleet, **filters)


def test_the_newest_entry_of_the_fleet_costs_a_key_a_host_not_the_whole_history(
    fleet: Store,
) -> None:
    counting = CountingStore(fleet)
    (newest,) = query_history(counting, LAYOUT, no_bad, limit=1)
    assert newest.entry.host == "node11" and newest.entry.seq == 59
    # 12 heads, one entry of each host's stream and of the policy's: 25 of 740 keys.
    assert counting.keys_read <= 12 + 13 + 2


def test_twenty_entries_read_about_twenty_entries(fleet: Store) -> None:
    counting = CountingStore(fleet)
    shown = query_history(counting, LAYOUT, no_bad, limit=20)
    assert len(shown) == 20
    assert counting.keys_read - 12 <= 13 * 4 + 2 * 20  # 13 first pages of 4, then the shown


def test_the_newest_twenty_of_a_large_fleet_cost_the_limit_not_the_hosts() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    for minute in range(600):  # 300 hosts, 2 entries each, one host after the other
        _append(store, host_stream(LAYOUT, f"node{minute % 300:03d}"), minute, "j", 0)
    counting = CountingStore(store)

    shown = query_history(counting, LAYOUT, no_bad, limit=20)

    assert shown == _everything(store, limit=20)
    assert [s.entry.at for s in shown][:2] == ["2026-06-01T09:59:00Z", "2026-06-01T09:58:00Z"]
    # 40 heads ranked, and the first pages of the 24 streams opened: not 300 of each.
    assert counting.keys_read <= 40 + 8 * 5 + 16 * 3 + 1


def test_a_since_window_reads_only_that_window(fleet: Store) -> None:
    counting = CountingStore(fleet)
    since = START + timedelta(minutes=720 - 24)  # the last two rounds
    shown = query_history(counting, LAYOUT, no_bad, since=since)
    assert len(shown) == 24
    # Each stream's first page (8) holds its window (2 entries) and what just precedes it.
    assert counting.keys_read <= 12 + 13 * SINCE_PAGE


def test_the_history_api_with_limit_1_reads_no_more_than_a_key_a_host(fleet: Store) -> None:
    counting = CountingStore(fleet)
    code, document = history_json(lambda: counting, LAYOUT, {"limit": "1"})
    assert code == 200 and len(document["entries"]) == 1
    assert counting.keys_read <= 12 + 13 + 2


def test_an_entry_appended_between_pages_is_not_shown_twice(fleet: Store) -> None:
    stream = host_stream(LAYOUT, "node0")
    reader = newest_entries(fleet, stream, no_bad, page=2)
    first = [next(reader), next(reader)]
    _append(fleet, stream, 10_000, "late", 0)
    rest = list(reader)
    seqs = [s.entry.seq for s in (*first, *rest)]
    assert seqs == list(range(59, -1, -1))


@pytest.mark.parametrize(
    ("limit", "streams", "page"),
    [(None, 5, None), (1, 1, 1), (20, 1, 20), (20, 1000, 1), (20, 13, 4), (10**6, 1, 1024)],
)
def test_the_first_page_shares_twice_the_limit_among_the_streams(
    limit: int | None, streams: int, page: int | None
) -> None:
    assert first_page(limit, streams) == page


@pytest.mark.parametrize("host", [None, "node1"])
def test_a_limit_of_zero_shows_nothing_and_reads_nothing(fleet: Store, host: str | None) -> None:
    counting = CountingStore(fleet)
    assert query_history(counting, LAYOUT, no_bad, host=host, limit=0) == []
    assert counting.keys_read == 0
