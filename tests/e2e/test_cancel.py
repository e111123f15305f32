"""``allocator cancel`` with a real agent (fake GPUs), on SQLite and a real etcd.

A cancelled pending submitted job never runs; a waiting ``run --wait`` or
``set --wait`` stops with "cancelled by USER", exit 3; a running submitted
job whose command ignores SIGTERM is killed after its grace, its GPUs free
and history naming who cancelled it; nothing to cancel is exit 6, another
user's request exit 5.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.control.holder import holder_name
from allocator.records.holders import QueueEntry
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive
from tests.e2e.test_submit import submit_policy
from tests.support.waiting import wait_for

#: The batch runner's grace between SIGTERM and SIGKILL, and slack for the agent's rounds.
GRACE_S = 10.0
SLACK_S = 15.0


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix, gpus=2)
    with harness.running(policy=submit_policy(tmp_path)):
        yield harness


@pytest.fixture
def waiters(world: AgentHarness) -> Iterator[list[subprocess.Popen[str]]]:
    """Waiting CLI processes a test starts; killed if one is left at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _queued(world: AgentHarness) -> list[str]:
    result = world.cli("queue", "-o", "json")
    assert result.code == 0, result.err
    return [q["job"] for q in json.loads(result.out)["queue"]]


def _holds(world: AgentHarness, job: str) -> bool:
    result = world.cli("get", f"job={job}", "-o", "json")
    assert result.code in (0, 6), result.err
    return result.code == 0


def _history(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    entries: list[dict[str, Any]] = json.loads(result.out)["entries"]
    return entries


def _submission_gone(world: AgentHarness, job: str) -> bool:
    key = world.layout.submission(holder_name(world.store_url), job)
    return _raw(world, key) is None


def _raw(world: AgentHarness, key: str) -> bytes | None:
    from allocator.store import open_store

    store = open_store(world.store_url)
    try:
        found = store.get(key)
    finally:
        store.close()
    return None if found is None else found.value


def _hog(world: AgentHarness) -> None:
    """Hold both GPUs, so what comes next waits."""
    result = world.cli("set", "job=hog", "count=2", f"host={HOST}")
    assert result.code == 0, result.err


def test_a_pending_submitted_job_is_cancelled_and_never_runs(world: AgentHarness) -> None:
    _hog(world)
    marker = world.workdir / "ran"
    script = f"open({str(marker)!r}, 'w').write('ran')"
    words = ("count=1", f"host={HOST}", "--", sys.executable, "-c", script)
    assert world.cli("submit", "job=never", *words).code == 0
    assert _queued(world) == ["never"]
    result = world.cli("cancel", "job=never")
    assert result.code == 0, result.err
    assert result.out.strip() == f"cancelled submitted job never on {HOST}"
    assert _queued(world) == []
    assert _submission_gone(world, "never")
    assert world.cli("release", "job=hog").code == 0
    # A job submitted after it runs and ends: the cancelled one, ahead of it, never ran.
    after = ("count=1", f"host={HOST}", "--", sys.executable, "-c", "pass")
    assert world.cli("submit", "job=after", *after).code == 0
    wait_for("the later job's end", lambda: _submission_gone(world, "after"), timeout=30)
    assert not marker.exists()
    assert not world.events("batch-started", job="never")


@pytest.mark.parametrize("command", ["run", "set"])
def test_a_waiting_request_stops_with_exit_3(
    world: AgentHarness, waiters: list[subprocess.Popen[str]], command: str
) -> None:
    _hog(world)
    words = ["job=patient", "count=1", f"host={HOST}", "--wait"]
    if command == "run":
        words += ["--", sys.executable, "-c", "pass"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "allocator", command, *words],
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiters.append(proc)
    wait_for("the waiter in the queue", lambda: _queued(world) == ["patient"], timeout=30)
    result = world.cli("cancel", "job=patient")
    assert result.code == 0, result.err
    assert result.out.strip() == f"cancelled waiting request patient on {HOST}"
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert f"cancelled by {holder_name(world.store_url)}" in err.splitlines()[-1]
    assert _queued(world) == []  # it did not join again
    assert not _holds(world, "patient")


def test_a_running_submitted_job_that_ignores_sigterm_is_killed(world: AgentHarness) -> None:
    pid_file = world.workdir / "pid"
    script = (
        "import os, pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "while True: time.sleep(0.05)"
    )
    words = ("count=1", f"host={HOST}", "--", sys.executable, "-c", script)
    assert world.cli("submit", "job=sticky", *words).code == 0
    wait_for("the job to run", lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
    pid = int(pid_file.read_text())
    result = world.cli("cancel", "job=sticky")
    assert result.code == 0, result.err
    assert result.out.strip().startswith(f"cancelled running job sticky on {HOST}: ")
    assert not _holds(world, "sticky")  # its GPUs are free at once
    wait_for("its command to be killed", lambda: not pid_alive(pid), timeout=GRACE_S + SLACK_S)
    wait_for("its record to go", lambda: _submission_gone(world, "sticky"), timeout=SLACK_S)
    reasons = [e.get("reason") for e in _history(world, "sticky")]
    assert f"cancelled by {holder_name(world.store_url)}" in reasons
    assert _queued(world) == []  # not queued again, never rerun


def test_nothing_is_exit_6_and_another_users_request_exit_5(world: AgentHarness) -> None:
    assert world.cli("cancel", "job=absent").code == 6
    assert world.cli("cancel", "--me").code == 6
    entry = QueueEntry(job="theirs", host=HOST, holder="someone-else", since="t", count=1)
    world.put_raw(world.layout.queue_entry(HOST, "theirs"), entry.to_json())
    refused = world.cli("cancel", "job=theirs")
    assert refused.code == 5, refused.err
    assert _queued(world) == ["theirs"]


def test_a_running_foreground_run_ends_when_cancelled(
    world: AgentHarness, waiters: list[subprocess.Popen[str]]
) -> None:
    script = "import time\nwhile True: time.sleep(0.05)"
    words = ["job=fg", "count=1", f"host={HOST}", "--", sys.executable, "-c", script]
    proc = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", *words],
        env=world.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiters.append(proc)
    wait_for("the run to hold its GPUs", lambda: _holds(world, "fg"), timeout=30)
    result = world.cli("cancel", "job=fg")
    assert result.code == 0, result.err
    _out, err = proc.communicate(timeout=GRACE_S + SLACK_S)
    # The agent (its holding is gone) or the run (its lease check) stops the command: SIGTERM.
    assert proc.returncode == 128 + 15, err
    assert not _holds(world, "fg")
