"""Stopping an ended holding's leftovers: the decision, and the scan on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.agent.processes.holding_ends import (
    Ending,
    HoldingEnds,
    carriers,
    next_step,
    orphaned,
)
from allocator.records.holding import HOLDING_VARIABLE, holding_identity
from allocator.records.types import Assignment, RunHolder
from tests.support.waiting import wait_for

NO_PID = 2**22 + 1  # above Linux's largest pid: a holder that is surely gone


def test_nothing_found_ends_it() -> None:
    assert next_step(Ending("j", "i"), {}, now=0.0, grace=5.0) == "done"


def test_sigterm_first_then_sigkill_after_the_grace() -> None:
    ending = Ending("j", "i")
    assert next_step(ending, {10: 1}, now=0.0, grace=5.0) == "term"
    ending.term_at, ending.seen = 0.0, {10: 1}
    assert next_step(ending, {10: 1}, now=4.9, grace=5.0) == "wait"
    assert next_step(ending, {10: 1, 11: 2}, now=4.9, grace=5.0) == "term"  # forked meanwhile
    assert next_step(ending, {10: 1, 11: 2}, now=5.0, grace=5.0) == "kill"


def _held(job: str, pid: int, ticks: int | None) -> Assignment:
    return Assignment(
        job=job, host="node1", gpus=(1,), mode="gpu", updated_by="t", updated_at="",
        run=RunHolder(pid=pid, start_ticks=ticks),
    )  # fmt: skip


def test_the_identity_names_job_host_and_the_holding_process() -> None:
    assert holding_identity(_held("a", 12, 345), "/p") == "/p:a@node1/12.345"
    assert holding_identity(_held("a", 12, 345), "/p") != holding_identity(
        _held("a", 12, 346), "/p"
    )
    assert holding_identity(_held("a", 12, 345), "/q") != holding_identity(
        _held("a", 12, 345), "/p"
    )


@pytest.fixture
def carrier(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose environment carries this test's holding, ignoring SIGTERM."""
    env = {**os.environ, HOLDING_VARIABLE: f"/t:{request.node.name}@node1/4194305.2"}
    code = (
        "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); "
        "signal.pause()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"\n"  # SIGTERM now ignored
    yield proc
    proc.kill()
    proc.communicate(timeout=10)


def test_an_ended_holdings_stubborn_process_is_killed_after_the_grace(
    carrier: subprocess.Popen[bytes], request: pytest.FixtureRequest
) -> None:
    identity = f"/t:{request.node.name}@node1/4194305.2"
    assert list(carriers({identity})[identity]) == [carrier.pid]
    assert carriers({identity + "0"}) == {}  # another holding's identity never matches
    events: list[tuple[str, Any]] = []
    ends = HoldingEnds(lambda event, fields: events.append((event, fields)), "/t", grace=5.0)
    ends.end(_held(request.node.name, NO_PID, 2))
    ends.tick(100.0)
    assert [e for e, _ in events] == ["holding-stopping"]
    ends.tick(104.0)
    assert carrier.poll() is None  # SIGTERM ignored, grace not over
    ends.tick(105.0)
    assert carrier.wait(10) == -9
    wait_for("the scan to see it gone", lambda: not carriers({identity}))
    ends.tick(105.1)
    assert events[-1] == ("holding-stopped", {"job": request.node.name, "holding": identity,
                          "pids": [carrier.pid], "killed": True, "grace_seconds": 5.0})  # fmt: skip
    assert not ends.active


def test_a_holding_with_nothing_left_is_forgotten_quietly() -> None:
    events: list[object] = []
    ends = HoldingEnds(lambda event, fields: events.append(event), "/t")
    ends.end(_held("gone", NO_PID, 2))
    ends.tick(0.0)
    assert not ends.active and events == []


def test_a_holding_ended_unseen_is_of_this_host_not_current_and_its_holder_gone() -> None:
    def gone(pid: int, ticks: int) -> bool:
        return False

    def alive(pid: int, ticks: int) -> bool:
        return (pid, ticks) == (12, 345)

    assert orphaned("/p:a@node1/12.345", ("/p", "node1"), set(), gone)
    assert not orphaned(
        "/p:a@node1/12.345", ("/p", "node1"), set(), alive
    )  # its assignment may be unread
    assert not orphaned(
        "/p:a@node1/12.345", ("/p", "node1"), {"/p:a@node1/12.345"}, gone
    )  # still held
    assert not orphaned("/p:a@node2/12.345", ("/p", "node1"), set(), gone)  # another host's
    assert not orphaned(
        "/p:a@node1/12.", ("/p", "node1"), set(), gone
    )  # no start time: cannot tell
    assert not orphaned("garbage", ("/p", "node1"), set(), gone)
    assert not orphaned("/p:a@node1/12.345", ("/q", "node1"), set(), gone)  # another namespace's


def test_a_sweep_ends_an_unseen_holding_only_once_its_processes_settled(
    carrier: subprocess.Popen[bytes], request: pytest.FixtureRequest
) -> None:
    from allocator.agent.kernel import procs

    stat = procs.read_stat(carrier.pid)
    assert stat is not None
    started = procs.ticks_to_epoch(stat.start_ticks)
    assert started is not None
    wall = [started + 1.0]
    ends = HoldingEnds(lambda event, fields: None, "/t", wall=lambda: wall[0])
    ends.sweep(0.0, "node1", {})
    assert not ends.active  # one second old: maybe a holding not read yet
    ends.sweep(3.0, "node1", {})
    assert not ends.active  # not due yet: it settles 5s after it started
    wall[0] = started + 5.0
    ends.sweep(4.0, "node1", {})
    assert ends.active
