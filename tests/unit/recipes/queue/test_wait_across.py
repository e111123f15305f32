"""A job across hosts that waits (a gang): both shares or neither, and no two gangs stuck."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from allocator.control.across_hosts import GroupResult
from allocator.control.client import Allocator
from allocator.errors import RequestError
from allocator.placement.choose import Request
from allocator.recipes.queue.wait import wait_and_assign_across
from allocator.store import open_store
from tests.support.waiting import wait_for

POLICY = "version: 1\nhosts:\n" + "".join(f"  node{i}: {{gpus: 1}}\n" for i in range(1, 8))
HOSTS = ("node1", "node2")

Got = dict[str, GroupResult | BaseException]
Start = Callable[[str, list[str]], Got]


@pytest.fixture
def client() -> Allocator:
    client = Allocator(open_store(f"memory://{uuid.uuid4().hex}"), actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    return client


@pytest.fixture
def gang(client: Allocator) -> Iterator[Start]:
    """Start ``job`` waiting on node1,node2 in a thread; what it got lands in the dict returned.

    Why it waits is appended to ``heard`` as it changes.
    """
    threads: list[threading.Thread] = []

    def start(job: str, heard: list[str]) -> Got:
        got: Got = {}

        def wait() -> None:
            try:
                request = Request(job=job, host="", count=1)
                got["result"] = wait_and_assign_across(
                    client, request, HOSTS, timeout=30, on_wait=heard.append
                )
            except BaseException as exc:  # handed to the test
                got["result"] = exc

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        threads.append(thread)
        return got

    yield start
    for thread in threads:
        thread.join(timeout=35)


def _held(client: Allocator) -> dict[str, list[str]]:
    return {h: sorted(client.host(h).assignments) for h in HOSTS}


def _waiting(client: Allocator, host: str) -> list[str]:
    from allocator.recipes.queue.order import decode_queue

    items = client.store.list(client.layout.host_queue(host)).items
    return [w.entry.job for w in decode_queue(items, lambda _bad: None)]


def test_a_gang_waits_for_every_host_and_never_holds_part(client: Allocator, gang: Start) -> None:
    client.assign(Request(job="x", host="node1", count=1))
    client.assign(Request(job="y", host="node2", count=1))
    heard: list[str] = []
    got = gang("g", heard)
    wait_for("g in both queues", lambda: [_waiting(client, h) for h in HOSTS] == [["g"], ["g"]])
    assert "held by job 'x'" in wait_for("why g waits", lambda: heard[:1])[0]
    client.release("node1", "x")
    # node1's GPU is free; the gang must not take it without node2's: it keeps waiting.
    wait_for("the gang to see node1 free", lambda: any("job 'y'" in why for why in heard))
    assert _held(client) == {"node1": [], "node2": ["y"]} and "result" not in got
    assert _waiting(client, "node1") == _waiting(client, "node2") == ["g"]
    client.release("node2", "y")
    result = wait_for("the gang's take", lambda: got.get("result"))
    assert isinstance(result, GroupResult), result
    assert _held(client) == {"node1": ["g"], "node2": ["g"]}
    assert not client.store.list(client.layout.queue).items  # every entry left


def test_two_gangs_on_the_same_hosts_take_their_turns_one_after_the_other(
    client: Allocator, gang: Start
) -> None:
    client.assign(Request(job="x", host="node1", count=1))
    client.assign(Request(job="y", host="node2", count=1))
    first = gang("g1", [])
    wait_for("g1 queued", lambda: _waiting(client, "node2") == ["g1"])
    second = gang("g2", [])
    wait_for("g2 queued", lambda: _waiting(client, "node2") == ["g1", "g2"])
    assert _waiting(client, "node1") == ["g1", "g2"]  # the same order on every host
    client.release("node2", "y")
    client.release("node1", "x")
    assert isinstance(wait_for("g1's take", lambda: first.get("result")), GroupResult)
    assert _held(client) == {"node1": ["g1"], "node2": ["g1"]} and "result" not in second
    client.release_across("g1")
    assert isinstance(wait_for("g2's take", lambda: second.get("result")), GroupResult)
    assert _held(client) == {"node1": ["g2"], "node2": ["g2"]}


def test_a_gang_over_what_one_transaction_holds_is_refused_before_it_waits(
    client: Allocator,
) -> None:
    from allocator.control.across_hosts import MAX_GANG_HOSTS

    hosts = [f"node{i}" for i in range(1, MAX_GANG_HOSTS + 2)]
    with pytest.raises(RequestError, match="at most"):
        wait_and_assign_across(client, Request(job="g", host="", count=1), hosts, timeout=1)
    assert not client.store.list(client.layout.queue).items
