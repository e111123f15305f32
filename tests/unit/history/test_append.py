"""``history.max_age``: appends drop their stream's old entries; prune drops everyone's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from allocator.control.client import Allocator
from allocator.history.append import MAX_TRIM, Head, aged_count, append_plan
from allocator.history.prune import prune_history
from allocator.history.stream import host_stream, read_history
from allocator.placement.choose import Request
from allocator.policy.model import HistorySettings
from allocator.records.keys import KeyLayout
from allocator.records.types import HistoryEntry
from allocator.store import Delete, Store
from tests.support.reads import no_bad

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
LAYOUT = KeyLayout()


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def _allocator(store: Store, clock: Clock, history: str) -> Allocator:
    allocator = Allocator(store, clock=clock, actor="alice@h")
    allocator.apply_policy(EXAMPLE + f"history: {history}\n", "p.yaml")
    return allocator


def _times(store: Store, host: str = "node1") -> list[str]:
    found = read_history(store, LAYOUT, no_bad, host=host, with_policy=False)
    return sorted(s.entry.at for s in found)


def _set(allocator: Allocator, gpu: int) -> None:
    allocator.assign(Request(job="train", host="node1", gpus=(gpu,)))


def _entry(at: str) -> HistoryEntry:
    return HistoryEntry(seq=0, at=at, by="x", action="set", host="node1", job="j")


# --- the decision (pure) ----------------------------------------------------------------------


def test_only_the_leading_entries_past_the_age_count() -> None:
    oldest = ("2026-05-01T00:00:00Z", "2026-05-02T00:00:00Z", "2026-05-30T00:00:00Z")
    now = "2026-06-01T00:00:00Z"
    assert aged_count(oldest, now, 10 * 86_400) == 2
    assert aged_count(oldest, now, 40 * 86_400) == 0
    assert aged_count(oldest, now, None) == 0
    # An unreadable time stops the count: it is never taken for old.
    assert aged_count(("2026-05-01T00:00:00Z", "soon", oldest[0]), now, 86_400) == 1


def test_an_append_drops_the_aged_oldest_at_most_max_trim_plus_one() -> None:
    stream = host_stream(LAYOUT, "node1")
    old = tuple(f"2026-05-0{d}T00:00:00Z" for d in range(1, 8))
    head = Head(first=3, next=10, limit=1000, revision=7, oldest=old)
    keep = HistorySettings(1000, max_age_seconds=86_400)

    _, ops, after = append_plan(stream, head, _entry("2026-06-01T00:00:00Z"), keep)

    deleted = [op.key for op in ops if isinstance(op, Delete) and not op.prefix]
    assert deleted == [stream.entry_key(seq) for seq in range(3, 3 + MAX_TRIM + 1)]
    assert (after.first, after.next, after.max_age) == (3 + MAX_TRIM + 1, 11, 86_400)
    # Every entry was known, so still is: the next append needs no read to judge them.
    assert after.oldest == (*old[MAX_TRIM + 1 :], "2026-06-01T00:00:00Z")


def test_without_a_policy_an_append_keeps_the_age_the_head_was_written_with() -> None:
    stream = host_stream(LAYOUT, "node1")
    head = Head(0, 2, 1000, 5, max_age=86_400, oldest=("2026-05-01T00:00:00Z",))

    _, ops, after = append_plan(stream, head, _entry("2026-06-01T00:00:00Z"), None)

    assert [op.key for op in ops if isinstance(op, Delete) and not op.prefix] == [
        stream.entry_key(0)
    ]
    assert after.max_age == 86_400


# --- through the writers, with the clock injected ----------------------------------------------


def test_entries_older_than_max_age_go_with_the_next_append(store: Store) -> None:
    clock = Clock()
    allocator = _allocator(store, clock, "{max_age: 2d}")
    _set(allocator, 0)
    clock.now += DAY
    _set(allocator, 1)
    clock.now += DAY + timedelta(minutes=1)  # the first is now past 2d, the second not

    _set(allocator, 2)

    assert _times(store) == ["2026-06-02T12:00:00Z", "2026-06-03T12:01:00Z"]


def test_a_release_without_the_policy_at_hand_keeps_the_age(store: Store) -> None:
    clock = Clock()
    allocator = _allocator(store, clock, "{max_age: 1d}")
    _set(allocator, 0)
    clock.now += 3 * DAY
    allocator.release("node1", "train")
    assert _times(store) == ["2026-06-04T12:00:00Z"]


def test_without_max_age_old_entries_stay(store: Store) -> None:
    clock = Clock()
    allocator = _allocator(store, clock, "{entries_per_host: 10}")
    _set(allocator, 0)
    clock.now += 400 * DAY
    _set(allocator, 1)
    assert len(_times(store)) == 2


# --- prune: streams nobody writes to ---------------------------------------------------------


def test_prune_drops_old_entries_everywhere_and_removes_streams_of_hosts_that_left(
    store: Store,
) -> None:
    clock = Clock()
    allocator = _allocator(store, clock, "{max_age: 7d}")
    for gpu in range(3):
        _set(allocator, gpu)
    allocator.assign(Request(job="eval", host="node2", gpus=(0,)))
    clock.now += 5 * DAY
    allocator.assign(Request(job="eval", host="node2", gpus=(1,)))
    clock.now += 5 * DAY  # node1's entries are 10 days old; node2 has one of 5 days

    done = prune_history(store, LAYOUT, frozenset({"node2"}), 7 * 86_400, clock.now, no_bad)

    # node1's 3, node2's older one, and the policy's (applied 10 days ago).
    assert (done.entries, done.pruned_streams, done.removed) == (5, 3, ("node1",))
    assert _times(store, "node1") == []
    assert store.get(host_stream(LAYOUT, "node1").head_key) is None
    assert _times(store, "node2") == ["2026-06-06T12:00:00Z"]
    again = prune_history(store, LAYOUT, frozenset({"node2"}), 7 * 86_400, clock.now, no_bad)
    assert (again.entries, again.removed) == (0, ())


def test_prune_drops_a_long_stream_a_page_at_a_time(store: Store) -> None:
    clock = Clock()
    allocator = _allocator(store, clock, "{max_age: 1d}")
    for i in range(130):
        _set(allocator, i % 3)
    clock.now += 2 * DAY

    done = prune_history(store, LAYOUT, frozenset({"node1"}), 86_400, clock.now, no_bad)

    assert done.entries == 130 + 1 and done.removed == ()  # and the policy's
    assert _times(store) == []
    _set(allocator, 0)  # the head still numbers the next entry
    (entry,) = read_history(store, LAYOUT, no_bad, host="node1", with_policy=False)
    assert entry.entry.seq == 130
