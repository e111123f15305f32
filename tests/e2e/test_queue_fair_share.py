"""Fair share orders two users of equal priority by decayed usage: SQLite and a real etcd.

alice held a GPU for two days (a real holding, ended by a real release, so
the rollup row is the one a write makes); bob used nothing. Both wait for
node1's one GPU at priority 0, alice first: bob is served first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import pytest

from allocator.control.client import Allocator
from allocator.placement.choose import Placement, Request
from allocator.recipes.queue.order import decode_queue
from allocator.recipes.queue.share import decayed_hours
from allocator.recipes.queue.wait import wait_and_assign
from allocator.records.types import Assignment
from allocator.store import Store, open_store
from allocator.util.times import utc_now
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

POLICY = """\
version: 1
hosts:
  node1: {gpus: 1}
operators: [user:root]
fair_share: {half_life: 7d, halve_at: 10}
"""
HELD = timedelta(days=2)


@pytest.fixture
def clients(store_url: str, prefix: str) -> Iterator[dict[str, Allocator]]:
    """An operator's client, alice's and bob's, each on its own connection."""
    opened: list[Store] = []
    made = {}
    for name in ("root", "alice", "bob"):
        store = open_store(store_url, create=True)
        opened.append(store)
        made[name] = Allocator(store, prefix=prefix, holder=name)
    made["root"].apply_policy(POLICY, "policy.yaml")
    yield made
    for store in opened:
        store.close()


def _queued(client: Allocator) -> list[str]:
    listing = client.store.list(client.layout.host_queue("node1"))
    return [w.entry.job for w in decode_queue(listing.items, lambda _bad: None)]


def _held_two_days_ago(client: Allocator) -> None:
    """alice's real holding of one GPU for the last two days, released now."""
    then = utc_now() - HELD
    past = Allocator(client.store, prefix=client.layout.prefix, holder="alice", clock=lambda: then)
    past.assign(Request(job="a-old", host="node1", count=1))
    client.release("node1", "a-old")


def test_the_user_with_less_recent_usage_goes_first(
    clients: dict[str, Allocator], cli: Cli
) -> None:
    root, alice, bob = clients["root"], clients["alice"], clients["bob"]
    _held_two_days_ago(alice)
    root.assign(Request(job="blocker", host="node1", count=1))
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(wait_and_assign, alice, Request(job="a-job", host="node1", count=1))
        wait_for("alice in the queue", lambda: _queued(root) == ["a-job"], 30)
        second = pool.submit(wait_and_assign, bob, Request(job="b-job", host="node1", count=1))
        wait_for("bob ahead of alice", lambda: _queued(root) == ["b-job", "a-job"], 30)
        shown = {q["holder"]: q for q in json.loads(cli("queue", "-o", "json").out)["queue"]}
        assert (shown["bob"]["fair_share"], shown["bob"]["usage"]) == (1.0, 0.0)
        two_days = decayed_hours(1, 0, HELD.total_seconds(), HELD.total_seconds(), 7 * 86_400)
        assert shown["alice"]["usage"] == pytest.approx(two_days, abs=0.1)  # ~44.6 of 48 h
        assert shown["alice"]["fair_share"] == pytest.approx(2 ** (-two_days / 10), abs=1e-3)
        assert "FAIRSHARE" in cli("queue").out
        root.release("node1", "blocker")
        assert _job(second) == "b-job"
        assert not first.done() and _queued(root) == ["a-job"]
        bob.release("node1", "b-job")
        assert _job(first) == "a-job"


def _job(waiter: Future[tuple[Assignment, Placement]]) -> str:
    assigned, _placed = waiter.result(timeout=60)
    return assigned.job
