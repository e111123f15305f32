"""The Consul backend's pure parts: key mapping, txn payloads and errors, the watch loop.

The watch loop runs here against a scripted query function and a fake clock,
so index resets and rate limiting are checked without servers or sleeping.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from allocator.errors import CasConflict, Compacted, InvalidInput, LeaseLost, PermissionDenied
from allocator.store import Delete, Event, Put
from allocator.store.consul.payloads import (
    Baselines,
    ConsulWatch,
    Item,
    LockHeld,
    TokenBucket,
    consul_key,
    diff_snapshot,
    guard_op,
    key_value,
    session_id,
    take_over,
    txn_failure,
    write_op,
)


def item(key: str, modify: int, value: bytes = b"v", create: int | None = None) -> Item:
    """A KV entry as py-consul returns it (value already decoded)."""
    return {"Key": key, "Value": value, "ModifyIndex": modify, "CreateIndex": create or modify}


class FakeClock:
    """A clock that only moves when something sleeps (plus a hair per reading)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def __call__(self) -> float:
        self.now += 0.0001  # so a loop that never sleeps still reaches its deadline
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds


class ScriptedQuery:
    """Answers watch queries from a script of (index, items); repeats the last one."""

    def __init__(self, *answers: tuple[int, list[Item]]) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    def __call__(self, index: int, wait: float) -> tuple[int, list[Item]]:
        self.asked.append(index)
        if len(self.answers) > 1:
            return self.answers.pop(0)
        return self.answers[0]


def watch_on(
    query: ScriptedQuery,
    start: int,
    clock: FakeClock,
    interval: float = 1.0,
    baselines: Baselines | None = None,
) -> ConsulWatch:
    return ConsulWatch(
        query,
        "/p/",
        start,
        min_interval=interval,
        clock=clock,
        sleep=clock.sleep,
        baselines=baselines,
    )


# --- keys, values, payloads --------------------------------------------------------


def test_store_keys_lose_their_leading_slash() -> None:
    assert consul_key("/allocator/v1/hosts/h/jobs/j") == "allocator/v1/hosts/h/jobs/j"
    assert consul_key("/", "prefix") == ""


@pytest.mark.parametrize("key", ["no-slash", "", "/", "//double"])
def test_keys_consul_cannot_hold_are_invalid_input(key: str) -> None:
    with pytest.raises(InvalidInput):
        consul_key(key)


def test_key_value_maps_indexes_and_the_session_to_a_lease() -> None:
    sid = str(uuid.uuid4())
    entry = {**item("a/b", 7, b"x", create=3), "Session": sid}

    kv = key_value(entry)

    assert (kv.key, kv.value, kv.mod_revision, kv.create_revision) == ("/a/b", b"x", 7, 3)
    assert kv.lease is not None and session_id(kv.lease) == sid
    assert key_value(item("a/c", 1, value=b"")).value == b""
    assert key_value({**item("a/d", 1), "Value": None}).lease is None


def test_a_lease_that_is_no_session_id_is_lost() -> None:
    with pytest.raises(LeaseLost):
        session_id(1 << 130)


def test_write_ops_carry_base64_values_random_flags_and_sessions() -> None:
    lease = uuid.uuid4().int
    plain, again = write_op(Put("/a", b"\x00v")), write_op(Put("/a", b"\x00v"))
    leased = write_op(Put("/b", b"v", lease=lease))

    assert plain["KV"]["Verb"] == "set" and plain["KV"]["Key"] == "a"
    assert base64.b64decode(plain["KV"]["Value"]) == b"\x00v"
    assert plain["KV"]["Flags"] != again["KV"]["Flags"]  # never an idempotent write
    assert leased["KV"]["Verb"] == "lock"
    assert leased["KV"]["Session"] == str(uuid.UUID(int=lease))
    assert write_op(Delete("/c")) == {"KV": {"Verb": "delete", "Key": "c"}}


def test_guard_ops_check_absence_or_the_modify_index() -> None:
    assert guard_op("/a", 0) == {"KV": {"Verb": "check-not-exists", "Key": "a"}}
    assert guard_op("/a", 9) == {"KV": {"Verb": "check-index", "Key": "a", "Index": 9}}


# --- txn errors ----------------------------------------------------------------------


def failure(verbs: Sequence[str], keys: Sequence[str], errors: list[dict[str, Any]]) -> Exception:
    payload = [
        {"KV": {"Verb": verb, "Key": key[1:]}} for verb, key in zip(verbs, keys, strict=True)
    ]
    return txn_failure("http://c:8500", payload, keys, errors)


def test_failed_checks_become_a_cas_conflict_naming_their_keys() -> None:
    exc = failure(
        ["check-index", "check-not-exists", "set"],
        ["/a", "/b", "/c"],
        [{"OpIndex": 0, "What": "index mismatch"}, {"OpIndex": 1, "What": 'key "b" exists'}],
    )

    assert isinstance(exc, CasConflict)
    assert exc.keys == ("/a", "/b")


def test_permission_denied_in_a_txn_is_permission_denied() -> None:
    exc = failure(["set"], ["/a"], [{"OpIndex": 0, "What": "Permission denied"}])
    assert isinstance(exc, PermissionDenied)


def test_a_lock_with_a_gone_session_is_lease_lost() -> None:
    exc = failure(["lock"], ["/a"], [{"OpIndex": 0, "What": 'invalid session "x"'}])
    assert isinstance(exc, LeaseLost)


def test_a_lock_held_by_another_session_is_reported_for_a_takeover() -> None:
    what = 'failed to lock key "a", lock is already held'
    exc = failure(["check-index", "lock"], ["/g", "/a"], [{"OpIndex": 1, "What": what}])
    assert isinstance(exc, LockHeld) and exc.keys == ("/a",)


def test_take_over_unlocks_a_held_key_just_before_locking_it() -> None:
    lock = write_op(Put("/a", b"v", lease=uuid.uuid4().int))
    payload = [guard_op("/g", 3), lock, write_op(Put("/b", b"w"))]

    new_payload, keys = take_over(payload, ["/g", "/a", "/b"], {"/a": "old-session"})

    assert [op["KV"]["Verb"] for op in new_payload] == ["check-index", "unlock", "lock", "set"]
    assert new_payload[1]["KV"] == {"Verb": "unlock", "Key": "a", "Session": "old-session"}
    assert keys == ["/g", "/a", "/a", "/b"]


# --- snapshots and the rate limiter -----------------------------------------------


def test_diff_reports_new_and_changed_keys_as_puts_in_revision_order() -> None:
    events, known = diff_snapshot(
        {"a": 5, "b": 6}, [item("a", 9), item("b", 6), item("c", 8)], 9, 0
    )

    assert events == [Event("put", "/c", b"v", 8), Event("put", "/a", b"v", 9)]
    assert known == {"a": 9, "b": 6, "c": 8}


def test_diff_reports_vanished_keys_as_deletes_at_the_response_index() -> None:
    events, known = diff_snapshot({"a": 5, "b": 6}, [item("c", 8)], 11, 0)

    assert events == [
        Event("put", "/c", b"v", 8),
        Event("delete", "/a", None, 11),
        Event("delete", "/b", None, 11),
    ]
    assert known == {"c": 8}


def test_diff_leaves_out_revisions_before_start_but_remembers_them() -> None:
    events, known = diff_snapshot({}, [item("a", 3), item("b", 7)], 7, 5)

    assert events == [Event("put", "/b", b"v", 7)]
    assert known == {"a": 3, "b": 7}


def test_token_bucket_allows_a_burst_then_one_per_interval() -> None:
    bucket = TokenBucket(interval=2.0, burst=2, now=0.0)

    bucket.take(0.0)
    bucket.take(0.0)

    assert bucket.delay(0.0) == pytest.approx(2.0)
    assert bucket.delay(1.5) == pytest.approx(0.5)
    assert bucket.delay(10.0) == 0.0
    assert bucket.tokens == 2  # never more than the burst


# --- the watch loop ------------------------------------------------------------------


def test_a_new_watch_replays_changes_since_its_baseline_in_revision_order() -> None:
    clock = FakeClock()
    baselines = Baselines()
    baselines.record("/p/", 9, 9, {"p/a": 3, "p/b": 5, "p/gone": 7})
    query = ScriptedQuery((12, [item("p/a", 3), item("p/b", 12), item("p/c", 10)]))

    watch = watch_on(query, 10, clock, baselines=baselines)

    assert watch.next(1.0) == [
        Event("put", "/p/c", b"v", 10),
        Event("put", "/p/b", b"v", 12),
        Event("delete", "/p/gone", None, 12),
    ]
    assert query.asked == [0]  # the first read does not block


def test_a_delete_then_a_put_between_list_and_watch_is_delivered() -> None:
    # The list saw a and b at 20; then b was deleted (21) and c put (22) before the
    # watch's first read. The newest change is the put, so only the baseline shows b went.
    clock = FakeClock()
    baselines = Baselines()
    baselines.record("/p/", 20, 20, {"p/a": 4, "p/b": 20})
    query = ScriptedQuery((22, [item("p/a", 4), item("p/c", 22)]))

    watch = watch_on(query, 21, clock, baselines=baselines)

    assert watch.next(1.0) == [Event("put", "/p/c", b"v", 22), Event("delete", "/p/b", None, 22)]


def test_a_delete_then_a_put_before_a_watch_without_baseline_raises_compacted() -> None:
    # Same history, but nothing says what the prefix held at 20: the delete of b
    # cannot be seen, so the watch must not pretend the put of c is all there was.
    clock = FakeClock()
    watch = watch_on(ScriptedQuery((22, [item("p/a", 4), item("p/c", 22)])), 21, clock)

    with pytest.raises(Compacted):
        watch.next(1.0)


def test_a_watch_resumed_after_its_last_event_needs_no_listing() -> None:
    clock = FakeClock()
    baselines = Baselines()
    baselines.record("/p/", 5, 5, {"p/a": 5})
    first = watch_on(
        ScriptedQuery((5, [item("p/a", 5)]), (7, [item("p/a", 5), item("p/b", 7)])),
        6,
        clock,
        baselines=baselines,
    )
    seen = first.next(1.0)
    first.close()
    assert seen == [Event("put", "/p/b", b"v", 7)]

    resumed = watch_on(
        ScriptedQuery((9, [item("p/b", 7)])), seen[-1].revision + 1, clock, baselines=baselines
    )

    assert resumed.next(1.0) == [Event("delete", "/p/a", None, 9)]


def test_baselines_are_found_by_revision_within_their_range_and_bounded() -> None:
    baselines = Baselines(prefixes=2, per_prefix=2)
    baselines.record("/a/", 5, 8, {"a/x": 5})
    baselines.record("/a/", 9, 9, {"a/x": 9})
    baselines.record("/a/", 10, 12, {})

    assert baselines.find("/a/", 7) is None  # the oldest range was dropped
    assert baselines.find("/a/", 9) == {"a/x": 9}
    assert baselines.find("/a/", 11) == {}
    assert baselines.find("/a/", 13) is None
    baselines.record("/b/", 1, 1, {})
    baselines.record("/c/", 1, 1, {})
    assert baselines.find("/a/", 11) is None  # least recently recorded prefix dropped


def test_a_watch_from_now_replays_nothing() -> None:
    clock = FakeClock()
    query = ScriptedQuery((12, [item("p/a", 12)]), (13, [item("p/a", 12), item("p/b", 13)]))

    watch = watch_on(query, 0, clock)

    assert watch.next(1.0) == [Event("put", "/p/b", b"v", 13)]
    assert query.asked == [0, 12]


def test_a_change_since_start_without_a_baseline_raises_compacted() -> None:
    clock = FakeClock()
    # Index 15 is newer than the start: something under the prefix changed, and
    # without knowing what it held at 13, a delete cannot be ruled out.
    watch = watch_on(ScriptedQuery((15, [item("p/a", 9)])), 14, clock)

    with pytest.raises(Compacted) as caught:
        watch.next(1.0)

    assert caught.value.compact_revision == 15


def test_changes_after_the_first_read_arrive_as_diffs() -> None:
    clock = FakeClock()
    query = ScriptedQuery(
        (5, [item("p/a", 5)]),
        (7, [item("p/a", 5), item("p/b", 7)]),
        (9, [item("p/b", 7)]),
    )
    watch = watch_on(query, 6, clock)

    assert watch.next(1.0) == [Event("put", "/p/b", b"v", 7)]
    assert watch.next(1.0) == [Event("delete", "/p/a", None, 9)]
    assert query.asked == [0, 5, 7]


def test_an_index_that_goes_backwards_resets_to_zero_and_keeps_new_writes() -> None:
    clock = FakeClock()
    query = ScriptedQuery(
        (20, [item("p/a", 18), item("p/b", 20)]),
        (4, [item("p/a", 3)]),  # a restored snapshot: older state, lower index
        (4, [item("p/a", 3)]),
        (5, [item("p/a", 3), item("p/new", 5)]),
    )
    watch = watch_on(query, 21, clock)

    after_restore = watch.next(1.0)
    assert after_restore == [Event("put", "/p/a", b"v", 3), Event("delete", "/p/b", None, 4)]
    assert watch.next(1.0) == [Event("put", "/p/new", b"v", 5)]  # revision 5 < start 21
    assert query.asked == [0, 20, 0, 4]  # index reset to 0 after going backwards


def test_an_index_of_zero_is_never_used_to_block() -> None:
    clock = FakeClock()
    query = ScriptedQuery((0, []), (0, []))
    watch = watch_on(query, 1, clock)

    watch.next(0.5)

    assert set(query.asked[1:]) == {1}


def test_a_server_answering_at_once_is_polled_at_the_limited_rate() -> None:
    clock = FakeClock()
    query = ScriptedQuery((5, [item("p/a", 5)]))  # never blocks, never changes
    watch = watch_on(query, 6, clock, interval=0.5)

    assert watch.next(10.0) == []

    # A burst of 2, then one query per 0.5 s of the 10 s: about 22, not thousands.
    assert 20 <= len(query.asked) - 1 <= 23
    assert clock.slept == pytest.approx(10.0, abs=0.05)


def test_changes_that_advance_the_index_are_not_held_back() -> None:
    clock = FakeClock()
    answers = [(i, [item("p/a", i)]) for i in range(5, 30)]
    watch = watch_on(ScriptedQuery(*answers), 6, clock, interval=100.0)

    batches = [watch.next(1.0) for _ in range(20)]

    assert [b[0].revision for b in batches] == list(range(6, 26))
    assert clock.slept == 0.0


def test_a_closed_watch_returns_nothing_and_closes_once() -> None:
    closed: list[bool] = []
    clock = FakeClock()
    watch = ConsulWatch(
        ScriptedQuery((5, [item("p/a", 5)])),
        "/p/",
        1,
        on_close=lambda: closed.append(True),
        clock=clock,
        sleep=clock.sleep,
    )

    watch.close()
    watch.close()

    assert watch.next(1.0) == []
    assert closed == [True]
