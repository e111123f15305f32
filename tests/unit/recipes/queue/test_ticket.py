"""A waiter's entries: one per host it waits on, in one transaction, under one lease."""

from __future__ import annotations

import uuid

from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.recipes.queue.order import decode_queue
from allocator.recipes.queue.ticket import Ticket
from allocator.store import open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 2}\n  node2: {gpus: 2}\n"


def test_a_gang_joins_every_hosts_queue_alike_and_leaves_them_all() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    client = Allocator(store, actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    ticket = Ticket(client, Request(job="g", host="", count=2), ("node1", "node2"), 10.0)
    keys = ticket.join()
    try:
        found = {
            host: decode_queue(store.list(client.layout.host_queue(host)).items, print)
            for host in ("node1", "node2")
        }
        (one,), (two,) = found["node1"], found["node2"]
        assert (one.key, two.key) == (keys["node1"], keys["node2"])
        assert one.name == two.name and one.arrived == two.arrived  # one transaction
        assert (one.entry.host, two.entry.host) == ("node1", "node2")
        assert one.entry.requested == two.entry.requested == "count=2 on node1,node2"
        assert one.entry.priority == two.entry.priority
        assert one.leased and two.leased
        arrivals = [store.get(client.layout.queue_arrivals(h)) for h in ("node1", "node2")]
        assert all(a is not None for a in arrivals)  # a take that joined meanwhile decides again
    finally:
        ticket.leave()
    assert not store.list(client.layout.queue).items
