"""A gang's turn: asked on every host inside one transaction, all shares or none."""

from __future__ import annotations

import uuid

import pytest

from allocator.control.client import Allocator
from allocator.control.gate import NotYourTurn
from allocator.placement.choose import Request
from allocator.recipes.queue.ticket import Ticket
from allocator.recipes.queue.turn import Gang
from allocator.store import open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 1}\n  node2: {gpus: 1}\n"
HOSTS = ("node1", "node2")


def _client() -> Allocator:
    client = Allocator(open_store(f"memory://{uuid.uuid4().hex}"), actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    return client


def _held(client: Allocator) -> dict[str, list[str]]:
    return {h: sorted(client.host(h).assignments) for h in HOSTS}


def test_a_gang_behind_anyone_on_one_host_takes_nothing_anywhere() -> None:
    client = _client()
    ahead = Ticket(client, Request(job="solo", host="node2", count=1), ("node2",), 10.0)
    ahead.join()  # first in node2's queue, and it could use node2's GPU
    request = Request(job="g", host="", count=1)
    ticket = Ticket(client, request, HOSTS, 10.0)
    gang = Gang(client, request, HOSTS)
    gang.seat(ticket.join())
    try:
        with pytest.raises(NotYourTurn, match="on node2: behind solo"):
            client.assign_across(request, HOSTS, gate=gang)
        assert _held(client) == {"node1": [], "node2": []}  # node1 was free: still not taken
        assert all(client.store.get(key) is not None for key in ticket.keys.values())
        ahead.leave()
        result = client.assign_across(request, HOSTS, gate=gang)
        assert [a.host for a in result.assignments] == list(HOSTS)
        assert _held(client) == {"node1": ["g"], "node2": ["g"]}
        assert not client.store.list(client.layout.queue).items  # its entries went with the take
    finally:
        ticket.leave()
        ahead.leave()


def test_a_gang_that_does_not_wait_yet_passes_only_an_empty_queue() -> None:
    client = _client()
    request = Request(job="g", host="", count=1)
    other = Ticket(client, Request(job="solo", host="node1", count=1), ("node1",), 10.0)
    other.join()
    try:
        with pytest.raises(NotYourTurn, match="on node1: behind solo"):
            client.assign_across(request, HOSTS, gate=Gang(client, request, HOSTS))
    finally:
        other.leave()
    client.assign_across(request, HOSTS, gate=Gang(client, request, HOSTS))
    assert _held(client) == {"node1": ["g"], "node2": ["g"]}
