"""A plain ``run`` waits in the queue as ``srun`` does; ``--wait=0`` does not; nobody jumps it.

Real CLI processes, on SQLite and a real etcd. The example policy: node1
has 4 GPUs, GPU 3 is reserved for ``eval-*`` jobs (3 GPUs to take).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.recipes.queue.order import decode_queue
from allocator.store import Store
from tests.e2e.conftest import Cli, history_entries
from tests.support.waiting import wait_for

TAKE_ALL = ("host=node1", "count=3")


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


def _queued(client: Allocator) -> list[str]:
    listing = client.store.list(client.layout.host_queue("node1"))
    return [w.entry.job for w in decode_queue(listing.items, lambda _bad: None)]


def _holders(client: Allocator) -> dict[str, tuple[int, ...]]:
    return {job: a.gpus for job, a in client.host("node1").assignments.items()}


def _until(path: Path) -> tuple[str, ...]:
    """A command that runs until ``path`` exists (the test's go, never a fixed sleep)."""
    script = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.02)"
    return (sys.executable, "-c", script)


def test_a_plain_run_waits_while_the_gpus_are_held_and_runs_once_released(
    applied: Cli, client: Allocator, spawn: Any
) -> None:
    assert applied("set", "job=blocker", *TAKE_ALL).code == 0
    run = spawn("run", "job=patient", "host=node1", "count=1", "--", sys.executable, "-c", "")
    wait_for("run in the queue", lambda: _queued(client) == ["patient"], 60)
    assert run.poll() is None
    assert applied("release", "job=blocker").code == 0
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    waiting = [line for line in err.splitlines() if "waiting" in line]
    assert len(waiting) == 1, err
    assert waiting[0].startswith("allocator: note: queued and waiting for resources: "), err
    assert "blocker" in waiting[0], err
    assert _queued(client) == [] and "patient" not in _holders(client)


@pytest.mark.parametrize("flag", ["--wait=0", "--immediate"])
def test_run_without_waiting_is_refused_at_once_naming_the_holder(
    applied: Cli, client: Allocator, flag: str
) -> None:
    assert applied("set", "job=blocker", *TAKE_ALL).code == 0
    refused = applied("run", "job=hasty", "host=node1", "count=1", flag, "--", "true")
    assert refused.code == 3, refused.err
    (line,) = refused.err.strip().splitlines()
    assert "held by job 'blocker'" in line, line
    assert _queued(client) == [] and "hasty" not in _holders(client)


def test_immediate_with_a_wait_is_invalid_input(applied: Cli) -> None:
    both = applied("run", "host=node1", "count=1", "--immediate", "--wait=5s", "--", "true")
    assert both.code == 2 and "--immediate" in both.err, both.err


def test_a_plain_run_cannot_jump_a_waiting_run(
    applied: Cli, client: Allocator, spawn: Any, tmp_path: Path
) -> None:
    assert applied("set", "job=blocker", "host=node1", "count=1").code == 0
    go = tmp_path / "go"
    first = spawn("run", "job=first", *TAKE_ALL, "--wait=120s", "--", *_until(go))
    wait_for("first in the queue", lambda: _queued(client) == ["first"], 60)
    # Two GPUs are free, but the request ahead could use them: the plain run queues behind.
    second = spawn("run", "job=second", "host=node1", "count=1", "--", "true")
    wait_for("second behind first", lambda: _queued(client) == ["first", "second"], 60)
    assert "second" not in _holders(client)
    hasty = applied("run", "job=hasty", "host=node1", "count=1", "--wait=0", "--", "true")
    assert hasty.code == 3 and "first" in hasty.err, hasty.err  # names the waiter ahead
    assert applied("release", "job=blocker").code == 0
    wait_for("first to hold the GPUs", lambda: _holders(client).get("first") == (0, 1, 2), 60)
    assert second.poll() is None and _queued(client) == ["second"]
    go.touch()
    first.communicate(timeout=60)
    assert first.returncode == 0
    _out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert "behind first" in err, err


def test_a_direct_set_passes_the_queue_and_says_so(
    applied: Cli, client: Allocator, spawn: Any
) -> None:
    assert applied("set", "job=blocker", "host=node1", "gpus=0").code == 0
    pair = spawn("set", "job=pair", "host=node1", "gpus=0,1", "--wait")
    wait_for("pair in the queue", lambda: _queued(client) == ["pair"], 60)
    aside = applied("set", "job=aside", "host=node1", "gpus=2")  # no one waits for GPU 2
    assert aside.code == 0 and "passed" not in aside.err, aside.err
    taken = applied("set", "job=operator", "host=node1", "gpus=1")
    assert taken.code == 0, taken.err
    said = "allocator: note: passed 1 waiting request(s) on node1 (allocator queue host=node1)"
    assert said in taken.err.splitlines(), taken.err
    (entry,) = history_entries(applied, "job=operator")
    assert "passed 1 waiting request(s) on node1: pair" in entry["detail"], entry
    assert pair.poll() is None and _queued(client) == ["pair"]
