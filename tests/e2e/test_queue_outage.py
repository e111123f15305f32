"""Waiters ride out a short store outage and keep their place (a real etcd, restarted)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.recipes.queue.order import decode_queue
from allocator.store import open_store
from tests.e2e.conftest import EXAMPLE_POLICY, Result, clean_env, run_cli
from tests.support.waiting import wait_for


@pytest.fixture
def world(etcd_server_private: Any, prefix: str) -> Iterator[tuple[Any, dict[str, str]]]:
    env = clean_env(
        ALLOCATOR_STORE=str(etcd_server_private.url),
        ALLOCATOR_PREFIX=prefix,
        ALLOCATOR_HOST="node1",
    )
    assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0
    yield etcd_server_private, env


def _entries(env: dict[str, str]) -> list[tuple[str, str]]:
    """(job, entry key) of node1's queue, in order; read with a fresh client each time."""
    store = open_store(env["ALLOCATOR_STORE"])
    try:
        client = Allocator(store, prefix=env["ALLOCATOR_PREFIX"])
        listing = store.list(client.layout.host_queue("node1"))
        return [(w.entry.job, w.key) for w in decode_queue(listing.items, lambda _bad: None)]
    finally:
        store.close()


def _start(env: dict[str, str], *words: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "allocator", *words],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(proc: subprocess.Popen[str]) -> Result:
    out, err = proc.communicate(timeout=60)
    return Result(proc.returncode, out, err)


def _ended(procs: list[subprocess.Popen[str]]) -> str:
    """Each waiter that exited: its exit code and its last line (the failure, whole)."""
    lines = []
    for number, proc in enumerate(procs):
        if proc.poll() is not None:
            done = _finished(proc)
            last = (done.err.strip().splitlines() or ["(nothing on stderr)"])[-1]
            lines.append(f"waiter {number} exited {done.code}: {last}")
    return "\n".join(lines)


def _up_for(seconds: float, procs: list[subprocess.Popen[str]]) -> None:
    """Let ``seconds`` pass (a fault's length or offset), ending early if a waiter exits."""
    end = time.monotonic() + seconds
    wait_for(
        f"{seconds} s to pass",
        lambda: time.monotonic() >= end or any(p.poll() is not None for p in procs),
        seconds + 5,
    )


def _two_waiters(env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """node1's GPUs held by ``hold``; ``first`` (set) and ``second`` (run) queued behind it."""
    assert run_cli(["set", "job=hold", "count=3", "host=node1"], env).code == 0
    procs = [_start(env, "set", "job=first", "count=1", "host=node1", "--wait=120s")]
    wait_for("first queued", lambda: [j for j, _ in _entries(env)] == ["first"], 30)
    procs.append(_start(env, "run", "job=second", "count=1", "host=node1", "--wait=120s",
                        "--", sys.executable, "-c", "pass"))  # fmt: skip
    wait_for("second queued", lambda: len(_entries(env)) == 2, 30)
    return procs


def _both_take_their_turn(env: dict[str, str], procs: list[subprocess.Popen[str]]) -> None:
    assert run_cli(["release", "job=hold"], env).code == 0
    results = [_finished(p) for p in procs]
    assert [r.code for r in results] == [0, 0], [r.err for r in results]


def test_set_and_run_waiters_keep_their_place_across_an_etcd_restart(
    world: tuple[Any, dict[str, str]],
) -> None:
    server, env = world
    procs = _two_waiters(env)
    before = _entries(env)
    try:
        server.kill()  # a crash, two seconds down, and a restart
        _up_for(2.0, procs)
        server.restart()
        assert all(p.poll() is None for p in procs), _ended(procs)
        assert _entries(env) == before  # the same entries, in the same order
        assert all(p.poll() is None for p in procs), _ended(procs)
        _both_take_their_turn(env, procs)
    finally:
        _stop(procs)


@pytest.mark.slow
def test_waiters_ride_out_etcd_killed_at_any_point_of_their_round(
    world: tuple[Any, dict[str, str]],
) -> None:
    """Killed mid-read, mid-take or mid-lease: a waiter tries again every two seconds (each
    ``run`` try grants a lease and revokes it), so ten kills a fifth of a second apart land
    on each step of that round. A take the kill cut off is read back before any other, and
    no waiter gives up or loses its place."""
    server, env = world
    procs = _two_waiters(env)
    before = _entries(env)
    try:
        for step in range(10):
            _up_for(0.2 * step, procs)
            server.kill()
            _up_for(0.3, procs)
            server.restart()
            assert all(p.poll() is None for p in procs), f"kill {step}: {_ended(procs)}"
            assert _entries(env) == before, f"kill {step}"
        _both_take_their_turn(env, procs)
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
