"""Nobody stalls the queue and nobody jumps it: real CLI processes, on SQLite and a real etcd.

The example policy: node1 has 4 GPUs, GPU 3 is reserved for ``eval-*`` jobs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.recipes.queue.order import decode_queue
from allocator.records.holders import QueueEntry
from allocator.store import Put, Store
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

LEASE_NOW = """
import sys
import allocator
from allocator.errors import ConflictError
try:
    with allocator.lease(count=1, host="node1", job="notebook"):
        sys.exit(0)
except ConflictError as refused:
    print(refused, file=sys.stderr)
    sys.exit(3)
"""


@pytest.fixture
def client(store: Store, prefix: str) -> Allocator:
    return Allocator(store, prefix=prefix)


@pytest.fixture
def spawn(cli_env: dict[str, str]) -> Iterator[Any]:
    """Start ``allocator WORDS...`` in the background; kill whatever is left at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*words: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "allocator", *words],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def queued(client: Allocator) -> list[str]:
    """The jobs waiting on node1, in queue order."""
    listing = client.store.list(client.layout.host_queue("node1"))
    return [w.entry.job for w in decode_queue(listing.items, lambda _bad: None)]


def holders(client: Allocator) -> dict[int, list[str]]:
    held: dict[int, list[str]] = {}
    for job, assignment in client.host("node1").assignments.items():
        for gpu in assignment.gpus:
            held.setdefault(gpu, []).append(job)
    return held


def test_a_request_that_can_never_be_placed_holds_no_one_up(
    applied: Cli, client: Allocator, spawn: Any
) -> None:
    # count=4 can never be placed on node1 (GPU 3 is reserved for others): 3 sit free.
    big = spawn("set", "job=big", "count=4", "host=node1", "--wait")
    wait_for("big in the queue", lambda: queued(client) == ["big"], 60)
    small = applied("set", "job=small", "count=1", "host=node1", "--wait=5s")
    assert small.code == 0, small.err
    ran = applied("run", "job=quick", "count=1", "host=node1", "--", "true")
    assert ran.code == 0, ran.err
    assert big.poll() is None


def test_a_count_waiter_is_placed_around_the_gpus_a_request_ahead_wants(
    applied: Cli, client: Allocator, spawn: Any
) -> None:
    assert applied("set", "job=held", "gpus=0", "host=node1").code == 0
    pair = spawn("set", "job=pair", "gpus=0,1", "host=node1", "--wait")
    wait_for("pair in the queue", lambda: queued(client) == ["pair"], 60)
    one = applied("set", "job=one", "count=1", "host=node1", "--wait=5s")
    assert one.code == 0, one.err
    assert holders(client)[2] == ["one"]  # GPU 1 is left for the pair ahead
    assert pair.poll() is None


def test_plain_runs_and_leases_never_pass_a_waiting_request(
    applied: Cli, client: Allocator, spawn: Any, cli_env: dict[str, str]
) -> None:
    assert applied("set", "job=hold", "count=1", "host=node1").code == 0
    big = spawn("set", "job=big", "count=3", "host=node1", "--wait")
    wait_for("big in the queue", lambda: queued(client) == ["big"], 60)
    for n in range(3):  # a stream of small runs: each would take a GPU big waits for
        ran = applied("run", f"job=small-{n}", "count=1", "host=node1", "--wait=0", "--", "true")
        assert ran.code == 3, ran.err
        assert "big" in ran.err and len(ran.err.strip().splitlines()) == 1
    leased = subprocess.run([sys.executable, "-c", LEASE_NOW], env=cli_env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert leased.returncode == 3, leased.stderr
    assert applied("release", "job=hold").code == 0  # one release: big is served
    _out, err = big.communicate(timeout=30)
    assert big.returncode == 0, err
    assert sorted(holders(client)) == [0, 1, 2] and holders(client)[0] == ["big"]


def test_sigterm_removes_the_waiters_entry_at_once(
    applied: Cli, client: Allocator, spawn: Any
) -> None:
    assert applied("set", "job=hold", "count=3", "host=node1").code == 0
    for words in (("set", "job=patient"), ("run", "job=patient")):
        tail = ("--", "true") if words[0] == "run" else ()
        waiter = spawn(*words, "count=1", "host=node1", "--wait", *tail)
        wait_for("the waiter in the queue", lambda: queued(client) == ["patient"], 60)
        waiter.send_signal(signal.SIGTERM)
        waiter.communicate(timeout=30)
        assert waiter.returncode != 0
        wait_for("its entry to go", lambda: queued(client) == [], 3)  # well within the lease
    timed = applied("run", "job=brief", "count=1", "host=node1", "--wait=1s", "--", "true")
    assert timed.code == 3 and queued(client) == []  # out of time: its entry is gone at once


def test_an_entry_with_no_lease_blocks_no_one_and_an_operator_removes_it(
    applied: Cli, client: Allocator, prefix: str
) -> None:
    assert applied("set", "job=hold", "count=3", "host=node1").code == 0
    forged = QueueEntry(job="ghost", host="node1", holder="x", since="t", count=1)
    key = client.layout.queue_entry("node1", "ghost0")
    client.store.txn([], [Put(key, forged.to_json())])
    assert applied("release", "job=hold").code == 0
    taken = applied("set", "job=mine", "count=1", "host=node1", "--wait=5s")
    assert taken.code == 0, taken.err
    removed = applied("queue", "remove", "host=node1", "entry=ghost0")
    assert removed.code == 0, removed.err
    assert client.store.get(key) is None
    missing = applied("queue", "remove", "host=node1", "entry=ghost0")
    assert missing.code == 6 and len(missing.err.strip().splitlines()) == 1
    for words in (["host=node1"], ["entry=x"], ["host=node1", "entry=a/b"]):
        bad = applied("queue", "remove", *words)
        assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1, bad.err
