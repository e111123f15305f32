"""The fleet's index of recent history: newest first by an ascending range, and its fallbacks."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from allocator.history import index as history_index
from allocator.history.append import prepare_append
from allocator.history.prune import prune_history
from allocator.history.read import query_history, read_recent
from allocator.history.stream import Stored, Stream, host_stream, policy_stream, read_history
from allocator.policy.model import HistorySettings
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Delete, KeyValue, Listing, Read, Store, open_store
from allocator.util.times import format_time
from tests.support.reads import CountingStore, no_bad

LAYOUT = KeyLayout()
HISTORY = LAYOUT.history
RECENT = history_index.recent_prefix(HISTORY)
START = datetime(2026, 6, 1, 10, tzinfo=UTC)
#: The reader's clock: a little after the fixtures' last entry.
NOW = START + timedelta(minutes=5)


def _append(store: Store, stream: Stream, at: datetime) -> None:
    entry = HistoryEntry(
        seq=0, at=format_time(at), by="alice", action="set", host=stream.host, job="j"
    )
    if stream.host is None:
        entry = HistoryEntry(seq=0, at=format_time(at), by="alice", action="policy-apply")
    compare, ops = prepare_append(store, stream, entry, HistorySettings(1000), no_bad)
    store.txn([compare], ops)


@pytest.fixture
def fleet() -> Store:
    """30 hosts, 3 entries each a second apart in turn, and two policy entries."""
    store = open_store(f"memory://{uuid.uuid4().hex}")
    second = 0
    for _ in range(3):
        for index in range(30):
            _append(
                store, host_stream(LAYOUT, f"node{index:02d}"), START + timedelta(seconds=second)
            )
            second += 1
        _append(store, policy_stream(LAYOUT), START + timedelta(seconds=second))
        second += 1
    return store


def _newest(store: Store, limit: int) -> list[Stored]:
    """What reading every stream shows first."""
    return read_history(store, LAYOUT, no_bad)[:limit]


def test_pointer_keys_sort_newest_first_across_hours_and_digits() -> None:
    times = [START + timedelta(minutes=m) for m in (0, 1, 59, 60, 61, 600)]
    times.append(datetime(2030, 1, 1, tzinfo=UTC))
    keys = [
        history_index.pointer_key(HISTORY, format_time(t), f"{HISTORY}hosts/n{i}/000000000001")
        for i, t in enumerate(times)
    ]
    assert all(k is not None and k.startswith(RECENT) for k in keys)
    assert sorted(k for k in keys if k is not None) == list(reversed(keys))


def test_a_pointer_names_its_entries_and_a_group_pointer_names_them_all() -> None:
    first = f"{HISTORY}hosts/a/000000000004"
    others = [f"{HISTORY}hosts/b/000000000009", f"{HISTORY}policy/000000000001"]
    ops = history_index.index_ops(HISTORY, format_time(START), [first, *others], trim=False)
    (put,) = ops
    pointer = KeyValue(put.key, put.value if not isinstance(put, Delete) else b"", 1, 1)

    assert history_index.entry_keys(HISTORY, pointer) == [first, *others]


def test_the_fleet_wide_newest_twenty_come_from_the_index_in_order(fleet: Store) -> None:
    counting = CountingStore(fleet)

    found = read_recent(counting, LAYOUT, no_bad, limit=20, now=NOW)

    assert found == _newest(fleet, 20)
    assert query_history(fleet, LAYOUT, no_bad, limit=20, now=NOW) == found
    # The pointers, those of the last second again, and the entries they name: bounded by
    # the limit, not the 30 hosts' heads.
    assert counting.keys_read <= 2 * 20 + 1


def test_the_index_is_read_a_few_buckets_at_a_time_back_from_the_readers_clock(
    fleet: Store,
) -> None:
    prefixes: list[str] = []

    class Recording(CountingStore):
        def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
            prefixes.extend(r.key for r in reads if r.prefix)
            return super().read_many(reads)

    # An hour on, the fixture's minutes of entries are many buckets back: still found.
    found = read_recent(Recording(fleet), LAYOUT, no_bad, limit=20, now=NOW + timedelta(hours=1))

    assert found == _newest(fleet, 20)
    # No read spans the index (etcd would walk all of it): buckets of 100 s, and the tie's second.
    assert all(p.startswith(RECENT) and len(p) > len(RECENT) + 9 for p in prefixes)
    assert len(prefixes) <= 4 + 8 + 16 + 32 + 1


def test_without_the_index_the_heads_still_give_the_newest_twenty(fleet: Store) -> None:
    fleet.txn([], [Delete(RECENT, prefix=True)])

    assert read_recent(fleet, LAYOUT, no_bad, limit=20, now=NOW) is None
    assert query_history(fleet, LAYOUT, no_bad, limit=20, now=NOW) == _newest(fleet, 20)


def test_an_index_shorter_than_the_limit_falls_back_to_the_heads(fleet: Store) -> None:
    assert read_recent(fleet, LAYOUT, no_bad, limit=200, now=NOW) is None
    assert query_history(fleet, LAYOUT, no_bad, limit=200, now=NOW) == _newest(fleet, 200)


def test_a_pointer_to_a_dropped_entry_falls_back_to_the_heads(fleet: Store) -> None:
    newest = next(s.entry for s in _newest(fleet, 5) if s.entry.host is not None)
    assert newest.host is not None
    fleet.delete(host_stream(LAYOUT, newest.host).entry_key(newest.seq))

    assert read_recent(fleet, LAYOUT, no_bad, limit=5, now=NOW) is None
    assert query_history(fleet, LAYOUT, no_bad, limit=5, now=NOW) == _newest(fleet, 5)


def test_an_append_drops_the_index_hour_kept_hours_before_its_own() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    stream = host_stream(LAYOUT, "node1")
    for hours in (0, 1, 2, 3):
        _append(store, stream, START + timedelta(hours=hours))

    left = [kv.key for kv in store.list(RECENT).items]
    # Hour 1 was cut by the append at hour 3; hour 0 by the one at hour 2.
    assert len(left) == 2
    assert [history_index.entry_keys(HISTORY, kv) for kv in store.list(RECENT).items] == [
        [stream.entry_key(3)],
        [stream.entry_key(2)],
    ]


def test_stale_hours_names_every_hour_no_append_cut() -> None:
    now = START + timedelta(hours=10)
    keys = [
        history_index.pointer_key(
            HISTORY, format_time(now - timedelta(hours=h)), f"{HISTORY}policy/000000000001"
        )
        for h in (0, 1, 2, 5, 5, 9)
    ]
    doomed = history_index.stale_hours(
        HISTORY, [k for k in keys if k is not None], int(now.timestamp())
    )

    assert len(doomed) == 3 and all(d.prefix for d in doomed)
    assert [d.key for d in doomed] == sorted(d.key for d in doomed)


def test_entries_of_one_second_are_ranked_by_revision_not_by_key() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    for index in range(30):  # node00 first: key order is the reverse of write order
        _append(store, host_stream(LAYOUT, f"node{index:02d}"), START)

    found = read_recent(store, LAYOUT, no_bad, limit=5, now=NOW)

    assert found is not None
    assert [s.entry.host for s in found] == ["node29", "node28", "node27", "node26", "node25"]
    assert found == _newest(store, 5)


def test_prune_cuts_the_index_hours_no_append_cut() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    _append(store, host_stream(LAYOUT, "node1"), START)  # its hour: nobody appends after it
    _append(store, host_stream(LAYOUT, "node2"), START + timedelta(hours=5, minutes=30))
    _append(store, host_stream(LAYOUT, "node2"), START + timedelta(hours=6))

    done = prune_history(
        store,
        LAYOUT,
        frozenset({"node1", "node2"}),
        30 * 86_400,
        START + timedelta(hours=6),
        no_bad,
    )

    assert done.index_hours == 1
    left = [key for kv in store.list(RECENT).items for key in history_index.entry_keys(HISTORY, kv)]
    assert left == [
        host_stream(LAYOUT, "node2").entry_key(1),
        host_stream(LAYOUT, "node2").entry_key(0),
    ]
    assert done.entries == 0  # the entries themselves are within max_age


def test_bucket_prefixes_cover_what_the_index_keeps_newest_first() -> None:
    now = int(NOW.timestamp())
    prefixes = history_index.bucket_prefixes(HISTORY, now)
    pointer = history_index.pointer_key(HISTORY, format_time(NOW), f"{HISTORY}policy/000000000001")
    older = history_index.pointer_key(
        HISTORY, format_time(NOW - timedelta(hours=2, minutes=30)), f"{HISTORY}policy/000000000002"
    )
    ahead = history_index.pointer_key(
        HISTORY, format_time(NOW + timedelta(minutes=5)), f"{HISTORY}policy/000000000003"
    )

    assert prefixes == sorted(prefixes)
    assert pointer is not None and older is not None and ahead is not None
    assert [i for i, p in enumerate(prefixes) if ahead.startswith(p)] < [
        i for i, p in enumerate(prefixes) if pointer.startswith(p)
    ]
    assert any(older.startswith(p) for p in prefixes)
