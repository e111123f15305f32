"""``allocator submit`` with a real agent (fake GPUs), on SQLite and a real etcd.

A submitted job runs unattended after the submitting process has exited,
writes its output file, ends, frees its GPUs, and history has its exit
status and GPU-seconds; an array of 4 on 2 GPUs runs 2 at a time; a queue
entry that the store does not prove (its record missing, or naming another
user) never runs.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.holders import QueueEntry
from allocator.records.submission import Submission
from allocator.store import Put, open_store
from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy
from tests.e2e.conftest import schema
from tests.support.waiting import wait_for


def submit_policy(workdir: Path) -> dict[str, Any]:
    """Two GPUs; where the tests run as root, root's submitted jobs allowed to run as root."""
    policy = agent_policy(workdir, gpus=2)
    if os.geteuid() == 0:
        policy["submit_as_root"] = ["root"]
    return policy


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix, gpus=2)
    with harness.running(policy=submit_policy(tmp_path)):
        yield harness


def _history(world: AgentHarness, job: str) -> list[dict[str, Any]]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    entries: list[dict[str, Any]] = json.loads(result.out)["entries"]
    return entries


def _ended(world: AgentHarness, job: str) -> dict[str, Any] | None:
    return next((e["ended"] for e in _history(world, job) if e.get("ended")), None)


def _holds(world: AgentHarness, job: str) -> bool:
    result = world.cli("get", f"job={job}", "-o", "json")
    assert result.code in (0, 6), result.err
    return result.code == 0


def test_a_submitted_job_runs_unattended_writes_its_output_and_is_recorded(
    world: AgentHarness,
) -> None:
    out = world.workdir / "job.out"
    script = "import os; print('gpus', os.environ.get('CUDA_VISIBLE_DEVICES')); raise SystemExit(3)"
    result = world.cli(
        "submit", "job=batch", "count=1", f"host={HOST}", f"output={out}", "--",
        sys.executable, "-c", script,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert result.out.split() == ["batch"]  # the submitter has exited: the agent runs it
    ended = wait_for("the job's end in history", lambda: _ended(world, "batch"), timeout=30)
    assert ended["exit_status"] == 3
    assert ended["gpu_seconds"] >= 0
    assert out.read_text().startswith("gpus ")
    assert not _holds(world, "batch")
    assert world.events("batch-ended", job="batch")


def _job_row(world: AgentHarness, job: str) -> dict[str, Any] | None:
    result = world.cli("status", "-o", "json")
    assert result.code == 0, result.err
    rows = [r for h in json.loads(result.out)["hosts"] for r in h["jobs"] if r["job"] == job]
    return rows[0] if rows else None


def test_status_and_get_say_who_submitted_a_running_job(world: AgentHarness) -> None:
    gate = world.workdir / "go"
    script = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    result = world.cli("submit", "job=held", "count=1", f"host={HOST}", "--",
                       sys.executable, "-c", script)  # fmt: skip
    assert result.code == 0, result.err
    wait_for("the job to hold its GPU", lambda: _holds(world, "held"), timeout=30)
    held = json.loads(world.cli("get", "job=held", "-o", "json").out)
    assert list(schema("get").iter_errors(held)) == []
    assert held["run"]["launched_by"] == "submit", held
    said = f"submitted by {held['holder']} (job held, run by the agent on {HOST})"
    row = wait_for(
        "status to say who submitted it",
        lambda: (r := _job_row(world, "held")) is not None and said in r["workers"] and r,
        timeout=30,
    )
    assert "allocator run" not in row["workers"], row
    gate.write_text("go")
    wait_for("the job's end in history", lambda: _ended(world, "held"), timeout=30)


def test_an_array_of_four_on_two_gpus_runs_two_at_a_time(world: AgentHarness) -> None:
    marks = world.workdir / "marks"
    marks.mkdir()
    gate = world.workdir / "go"
    # Each task marks that it runs, then waits for the test's go (never a fixed sleep).
    script = (
        "import os, pathlib, time; d = pathlib.Path(os.environ['MARKS']);"
        "i = os.environ['ALLOCATOR_ARRAY_INDEX']; (d / i).write_text(i);"
        "g = pathlib.Path(os.environ['GO'])\n"
        "while not g.exists(): time.sleep(0.02)"
    )
    result = world.cli(
        "submit", "job=arr", "count=1", f"host={HOST}", "--array=0-3", "--",
        "/usr/bin/env", f"MARKS={marks}", f"GO={gate}", sys.executable, "-c", script,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert result.out.split() == ["arr-0", "arr-1", "arr-2", "arr-3"]
    wait_for("two tasks to run", lambda: len(list(marks.iterdir())) == 2, timeout=30)
    running = sorted(f"arr-{p.name}" for p in marks.iterdir())
    assert [f"arr-{i}" for i in range(4) if _holds(world, f"arr-{i}")] == running
    assert len(list(marks.iterdir())) == 2  # the other two wait for GPUs
    gate.write_text("go")
    for index in range(4):
        wait_for(f"arr-{index} to end", lambda i=index: _ended(world, f"arr-{i}"), timeout=30)
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2", "3"]


def test_bad_input_writes_nothing(world: AgentHarness) -> None:
    cases = [
        ("count=1", f"host={HOST}"),  # no command
        ("count=1", "--", "true"),  # no host
        ("count=1", f"host={HOST}", "--array=3-1", "--", "true"),
        ("count=1", f"host={HOST}", "time=0s", "--", "true"),
        ("job=bad/name", "count=1", f"host={HOST}", "--", "true"),
        ("count=1", "host=nowhere", "--", "true"),
    ]
    for words in cases:
        result = world.cli("submit", *words)
        assert result.code == 2, (words, result.err)
    listed = world.cli("queue", "-o", "json")
    assert listed.code == 0, listed.err
    assert json.loads(listed.out)["queue"] == []
    # Its command line names the test's directory, so the cleanup ends it with the agent.
    hold = ("--", sys.executable, "-c", "import time; time.sleep(60)", str(world.workdir))
    again = world.cli("submit", "job=once", "gpus=0", f"host={HOST}", *hold)
    assert again.code == 0, again.err
    twice = world.cli("submit", "job=once", "gpus=0", f"host={HOST}", *hold)
    assert twice.code == 3, twice.err
    assert "already submitted" in twice.err


def _forge(world: AgentHarness, job: str, holder: str, pointer: str, record: bytes | None) -> None:
    """A queue entry (and maybe a record) written straight into the store, in one write."""
    entry = QueueEntry(
        job=job, host=HOST, holder=holder, since="2026-12-05T00:00:00Z", count=1,
        requested="count=1", self_service=True, submission=pointer,
    )  # fmt: skip
    ops = [Put(world.layout.queue_entry(HOST, f"forged{job}"), entry.to_json())]
    if record is not None:
        ops.append(Put(world.layout.submission(*pointer.split("/")), record))
    store = open_store(world.store_url)
    try:
        store.txn([], ops)
    finally:
        store.close()


def _record(world: AgentHarness, job: str, user: str) -> bytes:
    marker = world.workdir / f"{job}.ran"
    return Submission(
        job=job, user=user, host=HOST, argv=("touch", str(marker)), cwd=str(world.workdir),
        submitted_at="2026-12-05T00:00:00Z", count=1,
    ).to_json()  # fmt: skip


def test_a_forged_entry_never_runs_and_is_left_for_the_operator(world: AgentHarness) -> None:
    # Naming another user, with no record under that user's prefix.
    _forge(world, "norecord", "nobody", "nobody/norecord", None)
    # A record and an entry for another user: SQLite and etcd without auth prove no name.
    _forge(world, "claimed", "nobody", "nobody/claimed", _record(world, "claimed", "nobody"))
    # An entry naming one holder, pointing to another user's record.
    me = pwd.getpwuid(os.geteuid()).pw_name
    _forge(world, "mismatch", "nobody", f"{me}/mismatch", _record(world, "mismatch", me))
    for job in ("norecord", "claimed", "mismatch"):
        wait_for(f"{job} refused", lambda j=job: world.events("batch-refused", job=j))  # type: ignore[misc]
    reasons = {e["job"]: e["reason"] for e in world.events("batch-refused")}
    assert "no submission record nobody/norecord" in reasons["norecord"]
    assert "proves no user's name" in reasons["claimed"]
    assert "names holder 'nobody'" in reasons["mismatch"]
    # Refused once, logged, never run, still queued for the operator to remove.
    listed = world.cli("queue", "-o", "json")
    assert listed.code == 0, listed.err
    for job in ("norecord", "claimed", "mismatch"):
        assert job in listed.out
        assert not (world.workdir / f"{job}.ran").exists()
        assert not _holds(world, job)
        assert len(world.events("batch-refused", job=job)) == 1


def test_a_cancelled_submission_is_forgotten_and_never_runs(world: AgentHarness) -> None:
    marker = world.workdir / "later.ran"
    # Both GPUs held by an operator's set: the submitted job waits.
    assert world.cli("set", "job=big", "count=2", f"host={HOST}").code == 0
    done = world.cli("submit", "job=later", "count=1", f"host={HOST}", "--", "touch", str(marker))
    assert done.code == 0, done.err
    listed = world.cli("queue", "-o", "json")
    assert listed.code == 0, listed.err
    (entry,) = [e for e in json.loads(listed.out)["queue"] if e["job"] == "later"]
    removed = world.cli("queue", "remove", f"host={HOST}", f"entry={entry['entry']}")
    assert removed.code == 0, removed.err
    wait_for("the record's deletion", lambda: world.events("batch-cancelled", job="later"))
    assert world.cli("release", "job=big").code == 0
    assert not marker.exists()
    assert not _holds(world, "later")
