"""Waiting in the queue: what the waiter is told while it waits."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.control.gate import NotYourTurn
from allocator.errors import AmbiguousWrite, StoreUnavailable
from allocator.placement.choose import Request
from allocator.recipes.queue.faults import OUTAGE_S
from allocator.recipes.queue.tombstone import Cancelled, tombstone_ops
from allocator.recipes.queue.wait import wait_in_queue
from allocator.store import open_store
from allocator.store.base import Delete, KeyValue, Store

EXAMPLE = (Path(__file__).resolve().parents[4] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)


def test_the_waiter_hears_why_once_and_again_only_when_that_changes() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, clock=lambda: NOW, actor="alice@h")
    client.apply_policy(EXAMPLE, "p.yaml")
    refusals = iter(["held by job 'a'", "held by job 'a'", "behind b", "behind b", "behind b"])
    poke = client.layout.host_queue("node1") + "poke"

    def take(_gate: object) -> int:
        why = next(refusals, None)
        if why is None:
            return 42  # what the take wrote (a str would read as a refusal)
        store.put(poke, why.encode())  # a change the waiter watches: it tries again at once
        raise NotYourTurn(why)

    heard: list[str] = []
    request = Request(job="w", host="node1", count=1)
    assert wait_in_queue(client, request, take, timeout=60, on_wait=heard.append) == 42
    assert heard == ["held by job 'a'", "behind b"]
    assert store.list(client.layout.host_queue("node1")).items[0].key == poke  # its entry left


def _waiting_world() -> tuple[Allocator, Store]:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, clock=lambda: NOW, actor="alice@h")
    client.apply_policy(EXAMPLE, "p.yaml")
    return client, store


def test_a_waiter_reads_no_tombstone_round_after_round() -> None:
    """Only a deleted entry (or a watch that could have missed one) costs a tombstone read."""
    client, store = _waiting_world()
    reads: list[str] = []
    plain_get = store.get
    tombstones = f"{client.layout.root}/queue/cancelled/"

    def counting_get(key: str) -> KeyValue | None:
        if key.startswith(tombstones):
            reads.append(key)
        return plain_get(key)

    store.get = counting_get  # type: ignore[method-assign]
    poke = client.layout.host_queue("node1") + "poke"
    rounds = iter(range(8))

    def take(_gate: object) -> int:
        if next(rounds, None) is None:
            return 7
        store.put(poke, b"x")
        raise NotYourTurn("held by job 'a'")

    request = Request(job="w", host="node1", count=1)
    assert wait_in_queue(client, request, take, timeout=60, on_wait=lambda _why: None) == 7
    assert len(reads) <= 1, reads  # the watch's start, once


def test_a_cancelled_waiter_stops_naming_who_cancelled_it() -> None:
    client, store = _waiting_world()
    calls = iter(range(100))

    def take(_gate: object) -> int:
        if next(calls) == 2:  # the waiter has joined and watches: bob cancels it
            (entry,) = store.list(client.layout.host_queue("node1")).items
            store.txn([], [Delete(entry.key), *tombstone_ops(client, [entry.key], "bob@h")])
        raise NotYourTurn("held by job 'a'")

    request = Request(job="w", host="node1", count=1)
    with pytest.raises(Cancelled, match="cancelled by bob@h"):
        wait_in_queue(client, request, take, timeout=60, on_wait=lambda _why: None)


def _cut_world(
    failing_reads: int = 2, seconds_each: float = 0.0
) -> tuple[Allocator, Store, list[str], list[int], Callable[[], float]]:
    """A store whose next ``failing_reads`` reads of node1's queue fail (the store away),
    each taking ``seconds_each`` on the waiter's clock.

    Returns the world, the log of what happened, how many reads still fail,
    and the waiter's clock.
    """
    client, store = _waiting_world()
    log: list[str] = []
    failing = [failing_reads]
    now = [0.0]
    plain_get = store.get
    poke = client.layout.host_queue("node1") + "poke"

    def away_get(key: str) -> KeyValue | None:
        if key.startswith(client.layout.host_queue("node1")) and failing[0] > 0:
            failing[0] -= 1
            now[0] += seconds_each
            log.append("unread")
            store.put(poke, b"x")  # a change: the next round comes at once
            raise StoreUnavailable("etcd at 127.0.0.1:2379 is unavailable: failed to connect")
        return plain_get(key)

    store.get = away_get  # type: ignore[method-assign]
    return client, store, log, failing, lambda: now[0]


def _cut_take(client: Allocator, store: Store, log: list[str], landed: bool) -> object:
    """A take refused once, then cut off by the store (``landed``: after it deleted the
    waiter's entry, as a take that landed does), then one that succeeds (42)."""
    takes = iter(range(100))

    def take(_gate: object) -> int:
        n = next(takes)
        log.append(f"take {n}")
        if n == 1:
            if landed:
                (entry,) = [
                    kv for kv in store.list(client.layout.host_queue("node1")).items
                    if not kv.key.endswith("poke")
                ]  # fmt: skip
                store.delete(entry.key)
            raise AmbiguousWrite("etcd at 127.0.0.1:2379 may have applied the write")
        if n >= 2:
            return 42
        store.put(client.layout.host_queue("node1") + "poke", b"x")
        raise NotYourTurn("held by job 'a'")

    return take


def test_a_cut_off_take_is_read_back_before_the_waiter_takes_again() -> None:
    """The store went away mid-take and stays away for the read-back: the waiter rides
    that out, and takes again only once it has read that the cut-off take did not land."""
    client, store, log, failing, _clock = _cut_world()
    take = _cut_take(client, store, log, landed=False)
    request = Request(job="w", host="node1", count=1)
    heard: list[str] = []
    assert wait_in_queue(client, request, take, timeout=60, on_wait=heard.append) == 42
    assert log == ["take 0", "take 1", "unread", "unread", "take 2"]
    assert failing == [0]
    assert any("the store is unreachable, still in line" in why for why in heard), heard


def test_a_cut_off_take_that_landed_is_never_taken_again() -> None:
    """Its entry gone (the take deleted it in its own transaction), the waiter says the
    write may have landed (exit 4) and takes nothing more, however long the read-back took."""
    client, store, log, _failing, _clock = _cut_world()
    take = _cut_take(client, store, log, landed=True)
    request = Request(job="w", host="node1", count=1)
    with pytest.raises(AmbiguousWrite, match="may have applied"):
        wait_in_queue(client, request, take, timeout=60, on_wait=lambda _why: None)
    assert log == ["take 0", "take 1", "unread", "unread"]


def test_a_cut_off_take_unreadable_past_the_outage_limit_says_it_may_have_landed() -> None:
    """The store away past ``OUTAGE_S`` while the cut-off take is unread: the waiter gives
    up with the take's ``AmbiguousWrite`` (it may have landed), not a plain "unavailable"."""
    client, store, log, failing, clock = _cut_world(failing_reads=5, seconds_each=OUTAGE_S / 2)
    take = _cut_take(client, store, log, landed=False)
    request = Request(job="w", host="node1", count=1)
    with pytest.raises(AmbiguousWrite, match="may have applied"):
        wait_in_queue(client, request, take, on_wait=lambda _why: None, clock=clock)
    # The outage counts from the first unread (30 s on the clock): 90 s is past the limit.
    assert log == ["take 0", "take 1", "unread", "unread", "unread", "unread"]
    assert failing == [1]
