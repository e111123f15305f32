"""``allocator queue`` on a gang: its turn only where it is its turn on every host."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.recipes.queue.ticket import Ticket
from allocator.recipes.queue.view import queue_lines
from allocator.store import open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 1}\n  node2: {gpus: 1}\n"


def test_a_gang_free_on_one_host_says_what_holds_it_up_on_the_other() -> None:
    client = Allocator(open_store(f"memory://{uuid.uuid4().hex}"), actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    client.assign(Request(job="y", host="node2", count=1))
    ticket = Ticket(client, Request(job="g", host="", count=1), ("node1", "node2"), 10.0)
    ticket.join()
    try:
        lines = queue_lines(client, datetime.now(UTC))
    finally:
        ticket.leave()
    whys = {line.host: line.why for line in lines}
    assert whys["node2"].startswith("not enough free GPUs on node2")
    assert whys["node1"] == f"its turn here; waits on node2: {whys['node2']}"
    assert {line.requested for line in lines} == {"count=1 on node1,node2"}
