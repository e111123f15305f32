"""A job across hosts that waits (a gang), with real CLI processes, on SQLite and a real etcd.

``allocator set job=g host=node1,node2 count=1 --wait`` waits in both
hosts' queues and takes both shares in one transaction: never one of them.
What it holds is read back with ``allocator get`` and from the store.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.recipes.queue.order import decode_queue
from allocator.store import Store
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

POLICY = "version: 1\nhosts:\n  node1: {gpus: 1}\n  node2: {gpus: 1}\n"
HOSTS = ("node1", "node2")


@dataclass
class Waiter:
    """One ``set ... --wait`` process and the stderr lines it wrote so far."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finished(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)


Start = Callable[..., Waiter]


@pytest.fixture
def client(store: Store, prefix: str, cli: Cli, tmp_path: Path) -> Allocator:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    applied = cli("policy", "apply", str(path))
    assert applied.code == 0, applied.err
    return Allocator(store, prefix=prefix)


@pytest.fixture
def waiter(cli_env: dict[str, str]) -> Iterator[Start]:
    """Start ``allocator set WORDS --wait``; its stderr is read as it comes."""
    started: list[Waiter] = []

    def start(*words: str) -> Waiter:
        proc = subprocess.Popen(
            [sys.executable, "-m", "allocator", "set", *words],
            env=cli_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        found = Waiter(proc)
        stderr = proc.stderr
        assert stderr is not None
        found.reader = threading.Thread(target=lambda: found.lines.extend(stderr), daemon=True)
        found.reader.start()
        started.append(found)
        return found

    yield start
    for found in started:
        if found.proc.poll() is None:
            found.proc.kill()
        found.proc.wait()
        if found.reader is not None:
            found.reader.join(timeout=10)
        if found.proc.stderr is not None:
            found.proc.stderr.close()


def _held(client: Allocator) -> dict[str, list[str]]:
    return {h: sorted(client.host(h).assignments) for h in HOSTS}


def _queued(client: Allocator) -> list[list[str]]:
    """The jobs waiting on each host, in queue order."""
    listings = [client.store.list(client.layout.host_queue(h)).items for h in HOSTS]
    return [[w.entry.job for w in decode_queue(items, print)] for items in listings]


def _hold_both(cli: Cli) -> None:
    for job, host in (("x", "node1"), ("y", "node2")):
        result = cli("set", f"job={job}", f"host={host}", "count=1")
        assert result.code == 0, result.err


def test_a_gang_takes_both_hosts_or_neither(cli: Cli, client: Allocator, waiter: Start) -> None:
    _hold_both(cli)
    gang = waiter("job=g", "host=node1,node2", "count=1", "--wait=120s")
    wait_for("g in both queues", lambda: _queued(client) == [["g"], ["g"]], 60)
    wait_for("why g waits", lambda: gang.said("waiting: not enough free GPUs on node1"), 30)
    assert cli("release", "job=x").code == 0
    # node1 is free now, node2 not: the gang sees it and still takes nothing.
    wait_for("g to wait for node2", lambda: gang.said("(0: held by job 'y')"), 30)
    assert _held(client) == {"node1": [], "node2": ["y"]}
    assert cli("get", "job=g").code == 6  # no share of it anywhere
    assert gang.proc.poll() is None
    assert cli("release", "job=y").code == 0
    assert gang.finished() == 0, "".join(gang.lines)
    assert _held(client) == {"node1": ["g"], "node2": ["g"]}
    assert _queued(client) == [[], []]
    got = cli("get", "job=g")
    assert got.code == 0 and "node1,node2" in got.out, got.out


def test_two_gangs_on_the_same_two_hosts_do_not_deadlock(
    cli: Cli, client: Allocator, waiter: Start
) -> None:
    _hold_both(cli)
    first = waiter("job=g1", "host=node1,node2", "count=1", "--wait=120s")
    wait_for("g1 queued", lambda: _queued(client) == [["g1"], ["g1"]], 60)
    # The second names its hosts the other way round: its node ranks, not its place in line.
    second = waiter("job=g2", "host=node2,node1", "count=1", "--wait=120s")
    wait_for("g2 queued", lambda: _queued(client) == [["g1", "g2"], ["g1", "g2"]], 60)
    assert cli("release", "job=y").code == 0
    assert cli("release", "job=x").code == 0
    assert first.finished() == 0, "".join(first.lines)
    assert _held(client) == {"node1": ["g1"], "node2": ["g1"]}
    assert second.proc.poll() is None
    assert cli("release", "job=g1").code == 0
    assert second.finished() == 0, "".join(second.lines)
    assert _held(client) == {"node1": ["g2"], "node2": ["g2"]}
    assert _queued(client) == [[], []]


def test_ctrl_c_leaves_every_hosts_queue(cli: Cli, client: Allocator, waiter: Start) -> None:
    import signal

    _hold_both(cli)
    gang = waiter("job=g", "host=node1,node2", "count=1", "--wait")
    wait_for("g in both queues", lambda: _queued(client) == [["g"], ["g"]], 60)
    gang.proc.send_signal(signal.SIGINT)
    gang.finished()
    assert _queued(client) == [[], []]
    assert _held(client) == {"node1": ["x"], "node2": ["y"]}
