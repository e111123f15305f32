"""Quotas in the queue's turn rule, for every user: two holders on one store (SQLite, real etcd).

Each holder is its own client (``alice``, ``bob``); alice has a quota of 2
GPUs, bob none. node1 has 4 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allocator.control.client import Allocator
from allocator.control.quotas import counter_key
from allocator.errors import ConflictError
from allocator.placement.choose import Request
from allocator.recipes.holding import hold
from allocator.recipes.queue.wait import WaitTimedOut, wait_and_assign
from allocator.records.holders import QueueEntry
from allocator.store import Put, Store, open_store
from tests.support.waiting import wait_for

POLICY = """\
version: 1
hosts:
  node1: {gpus: 4}
quotas:
  - who: user:alice
    gpus: 2
"""


@pytest.fixture
def clients(store_url: str, prefix: str) -> Iterator[dict[str, Allocator]]:
    """An operator's client and alice's and bob's, each on its own connection."""
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


def _queue(client: Allocator, job: str, count: int) -> str:
    """A live waiter's entry for ``client``'s holder (leased, as a waiting process writes it)."""
    store, layout = client.store, client.layout
    lease = store.grant_lease(30)
    entry = QueueEntry(job=job, host="node1", holder=client.holder, since="t", count=count)
    key = layout.queue_entry("node1", job)
    store.txn(
        [], [Put(key, entry.to_json(), lease=lease), Put(layout.queue_arrivals("node1"), b"x")]
    )
    return key


def _count(job: str, n: int) -> Request:
    return Request(job=job, host="node1", count=n)


def test_a_waiter_over_quota_is_passed_by_others(clients: dict[str, Allocator]) -> None:
    alice, bob = clients["alice"], clients["bob"]
    alice.assign(_count("a-held", 2))  # alice holds her whole quota
    _queue(alice, "a-more", 1)  # and waits for one more: she must release first
    assigned, _ = wait_and_assign(bob, _count("b-1", 1), timeout=5)
    assert assigned.job == "b-1"


def test_a_killed_runs_charge_does_not_put_its_owner_over_quota(
    clients: dict[str, Allocator],
) -> None:
    root, alice, bob = clients["root"], clients["alice"], clients["bob"]
    root.assign(_count("blk", 2))
    ghost = hold(alice, _count("a-run", 1), ttl=1)
    ghost.keeper.stop()  # killed: no release, the lease runs out, the charge stays
    wait_for("the run's lease to expire", lambda: "a-run" not in alice.host("node1").assignments)
    _queue(alice, "a-two", 2)  # 0 held really, 2 asked: within her quota, first in line
    with pytest.raises(WaitTimedOut, match=": behind a-two"):
        wait_and_assign(bob, _count("b-1", 1), timeout=1.5)


def test_a_damaged_counter_is_reported_and_charges_nothing_more(
    clients: dict[str, Allocator],
) -> None:
    alice = clients["alice"]
    key = counter_key(alice.layout, "user:alice")
    alice.store.txn([], [Put(key, b"{not json")])
    with pytest.raises(ConflictError, match="damaged"):
        alice.assign(_count("a-1", 1))
    assert "a-1" not in alice.host("node1").assignments
    assert alice.store.get(key).value == b"{not json"  # type: ignore[union-attr]
