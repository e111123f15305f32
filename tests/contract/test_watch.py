"""Contract: watches deliver every change once, in order, from a revision, on every backend."""

from __future__ import annotations

import time

import pytest

from allocator.errors import Compacted
from allocator.store import Delete, Event, Put, Store, Watch

# Generous: a watch must deliver within it, but tests return as soon as it does.
DEADLINE_S = 10.0


def collect(watch: Watch, count: int, deadline_s: float = DEADLINE_S) -> list[Event]:
    """Gather events until ``count`` arrived or the deadline passed."""
    events: list[Event] = []
    deadline = time.monotonic() + deadline_s
    while len(events) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        events.extend(watch.next(min(remaining, 1.0)))
    return events


def summary(events: list[Event]) -> list[tuple[str, str, bytes | None, int]]:
    """Events as plain tuples, for readable comparisons."""
    return [(e.type, e.key, e.value, e.revision) for e in events]


def test_watch_sees_every_change_once_in_revision_order(store: Store, prefix: str) -> None:
    watched = f"{prefix}/w/"
    start = store.put(f"{prefix}/before", b"x") + 1
    watch = store.watch(watched, start)
    try:
        expected: list[tuple[str, str, bytes | None, int]] = []
        for i in range(12):
            key = f"{watched}k{i % 4}"
            if i % 5 == 4:
                assert store.delete(key) is True
                expected.append(("delete", key, None, store.list(watched).revision))
            else:
                value = f"v{i}".encode()
                expected.append(("put", key, value, store.put(key, value)))

        if keeps_history(store):
            events = collect(watch, len(expected))
            assert summary(events) == expected
        else:
            events = collect_until_quiet(watch)
            assert_coalesced(summary(events), expected)
        assert watch.next(0.3) == []
    finally:
        watch.close()


def keeps_history(store: Store) -> bool:
    """Consul keeps no history: a watch sees the latest version of what changed.

    Changes made between two of its blocking reads are coalesced (the store
    protocol promises "at most once" and revision order, not every version).
    The agent is level-based, so it needs no more than that.
    """
    return not store.url.startswith(("consul://", "consuls://"))


def collect_until_quiet(watch: Watch, quiet_s: float = 1.5) -> list[Event]:
    """Gather events until none arrived for ``quiet_s`` (or the deadline passed)."""
    events: list[Event] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        batch = watch.next(quiet_s)
        if not batch:
            break
        events.extend(batch)
    return events


def assert_coalesced(
    seen: list[tuple[str, str, bytes | None, int]],
    expected: list[tuple[str, str, bytes | None, int]],
) -> None:
    """Seen events are a subsequence of the true history that ends each key in its final state."""
    revisions = [revision for *_, revision in seen]
    assert revisions == sorted(revisions) and len(set(seen)) == len(seen), seen
    puts = {(kind, key, value) for kind, key, value, _ in expected if kind == "put"}
    assert all(kind == "delete" or (kind, key, value) in puts for kind, key, value, _ in seen), seen
    final_expected: dict[str, bytes | None] = {}
    for _kind, key, value, _rev in expected:
        final_expected[key] = value
    final_seen: dict[str, bytes | None] = {}
    for _kind, key, value, _rev in seen:
        final_seen[key] = value
    # A key created and deleted between two reads is never seen at all.
    visible = {k: v for k, v in final_expected.items() if v is not None or k in final_seen}
    assert final_seen == visible


def test_txn_events_share_one_revision(store: Store, prefix: str) -> None:
    watched = f"{prefix}/w/"
    store.put(f"{watched}old", b"o")
    start = store.list(watched).revision + 1
    watch = store.watch(watched, start)
    try:
        revision = store.txn([], [Put(f"{watched}new", b"n"), Delete(f"{watched}old")])

        events = collect(watch, 2)

        assert sorted(summary(events)) == [
            ("delete", f"{watched}old", None, revision),
            ("put", f"{watched}new", b"n", revision),
        ]
    finally:
        watch.close()


def test_watch_from_a_past_revision_replays_from_it(store: Store, prefix: str) -> None:
    watched = f"{prefix}/w/"
    first = store.put(f"{watched}a", b"1")
    second = store.put(f"{watched}b", b"2")
    third = store.put(f"{watched}a", b"3")

    watch = store.watch(watched, second)
    if not keeps_history(store):  # Consul: a fresh read replaces the replay
        watch = recover_from_compaction(store, watch, watched)
        try:
            later = store.put(f"{watched}c", b"4")
            assert summary(collect(watch, 1)) == [("put", f"{watched}c", b"4", later)]
        finally:
            watch.close()
        return
    try:
        events = collect(watch, 2)
        assert summary(events) == [
            ("put", f"{watched}b", b"2", second),
            ("put", f"{watched}a", b"3", third),
        ]
        assert all(e.revision > first for e in events)
        later = store.put(f"{watched}c", b"4")
        assert summary(collect(watch, 1)) == [("put", f"{watched}c", b"4", later)]
    finally:
        watch.close()


def recover_from_compaction(store: Store, watch: Watch, watched: str) -> Watch:
    """A store without history cannot replay from an old revision: it says so, once.

    The watch raises ``Compacted`` (it cannot rule out a lost delete); the
    documented recovery, a fresh read and a watch from its revision + 1,
    then works.
    """
    with pytest.raises(Compacted):
        watch.next(DEADLINE_S)
    watch.close()
    return store.watch(watched, store.list(watched).revision + 1)


def test_a_watch_from_a_revision_it_cannot_replay_raises_compacted_or_replays(
    store: Store, prefix: str
) -> None:
    """A delete and then a put before the watch starts: delivered, or Compacted, never lost."""
    watched = f"{prefix}/w/"
    store.put(f"{watched}a", b"1")
    other = store.put(f"{prefix}/elsewhere", b"x")  # not the listing: no baseline anywhere
    deleted = store.delete(f"{watched}a")
    put = store.put(f"{watched}b", b"2")

    watch = store.watch(watched, other + 1)
    try:
        if keeps_history(store):
            events = collect(watch, 2)
            assert [(e.type, e.key) for e in events] == [
                ("delete", f"{watched}a"),
                ("put", f"{watched}b"),
            ]
            assert deleted and events[-1].revision == put
        else:
            with pytest.raises(Compacted):
                collect(watch, 2)
    finally:
        watch.close()


def test_a_delete_then_a_put_between_list_and_watch_are_both_delivered(
    store: Store, prefix: str
) -> None:
    watched = f"{prefix}/w/"
    store.put(f"{watched}a", b"1")
    listing = store.list(watched)
    store.delete(f"{watched}a")
    put = store.put(f"{watched}b", b"2")

    watch = store.watch(watched, listing.revision + 1)
    try:
        events = collect(watch, 2)
        assert sorted((e.type, e.key) for e in events) == [
            ("delete", f"{watched}a"),
            ("put", f"{watched}b"),
        ]
        assert max(e.revision for e in events) == put
    finally:
        watch.close()


def test_resuming_after_the_last_seen_revision_misses_nothing(store: Store, prefix: str) -> None:
    watched = f"{prefix}/w/"
    watch = store.watch(watched, store.list(watched).revision + 1)
    store.put(f"{watched}a", b"1")
    try:
        seen = collect(watch, 1)
    finally:
        watch.close()
    # Changes made while nobody watches must arrive when watching resumes.
    gap = [store.put(f"{watched}b", b"2"), store.put(f"{watched}c", b"3")]

    resumed = store.watch(watched, seen[-1].revision + 1)
    try:
        assert [e.revision for e in collect(resumed, 2)] == gap
        assert resumed.next(0.2) == []
    finally:
        resumed.close()


def test_watch_does_not_see_sibling_prefixes(store: Store, prefix: str) -> None:
    watched = f"{prefix}/a/b/"
    start = store.put(f"{prefix}/marker", b"m") + 1
    watch = store.watch(watched, start)
    try:
        store.put(f"{prefix}/a/bc", b"sibling")
        store.put(f"{prefix}/a/bc/x", b"sibling child")
        store.put(f"{prefix}/a/b", b"the prefix key itself")
        inside = store.put(f"{prefix}/a/b/x", b"inside")
        store.put(f"{prefix}/a/c/x", b"elsewhere")

        events = collect(watch, 1)
        assert summary(events) == [("put", f"{prefix}/a/b/x", b"inside", inside)]
        assert watch.next(0.3) == []
    finally:
        watch.close()


def test_next_on_a_quiet_prefix_returns_an_empty_batch(store: Store, prefix: str) -> None:
    start = store.put(f"{prefix}/elsewhere", b"x") + 1
    watch = store.watch(f"{prefix}/quiet/", start)
    try:
        store.put(f"{prefix}/elsewhere", b"y")
        assert watch.next(0.3) == []
    finally:
        watch.close()
