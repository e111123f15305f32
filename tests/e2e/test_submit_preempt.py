"""Preemptible jobs with a real agent (fake GPUs), on SQLite and a real etcd.

A ``--preemptible`` submitted job holds the host's GPU 0; a normal request
for it arrives (``set --wait``, ``run --wait``); within the job's grace and
the propagation, the preemptible job is stopped, released with history
``preempted by JOB``, the normal request holds the GPU and the submission
is back in the queue; once the normal one lets go, it runs again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness
from tests.e2e.test_submit import submit_policy
from tests.support.waiting import wait_for

#: How long a take-back may take beyond the grace: the holder's look and the waiter's wake-up.
PROPAGATION_S = 10.0

# Marks each start in a file, then runs until the test's go (never a fixed sleep).
SCRIPT = (
    "import os, pathlib, time; m = pathlib.Path(os.environ['MARKS']);"
    "m.open('a').write('started\\n'); g = pathlib.Path(os.environ['GO'])\n"
    "while not g.exists(): time.sleep(0.05)"
)


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix, gpus=2)
    with harness.running(policy=submit_policy(tmp_path)):
        yield harness


def _holds(world: AgentHarness, job: str) -> bool:
    result = world.cli("get", f"job={job}", "-o", "json")
    assert result.code in (0, 6), result.err
    return result.code == 0


def _queued(world: AgentHarness) -> list[str]:
    """The jobs waiting, a preemptible one marked ``job*``."""
    listed = world.cli("queue", "-o", "json")
    assert listed.code == 0, listed.err
    entries = json.loads(listed.out)["queue"]
    return [e["job"] + ("*" if e.get("preemptible") else "") for e in entries]


def _reasons(world: AgentHarness, job: str) -> list[str]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    return [str(e.get("reason", "")) for e in json.loads(result.out)["entries"]]


def _starts(marks: Path) -> int:
    return len(marks.read_text().splitlines()) if marks.exists() else 0


def _submit_preemptible(world: AgentHarness, marks: Path, go: Path) -> None:
    result = world.cli(
        "submit", "job=pre", "gpus=0", f"host={HOST}", "grace=5s", "--preemptible", "--",
        "/usr/bin/env", f"MARKS={marks}", f"GO={go}", sys.executable, "-c", SCRIPT,
    )  # fmt: skip
    assert result.code == 0, result.err
    wait_for("the preemptible job to run", lambda: _starts(marks) == 1, timeout=30)
    assert _holds(world, "pre")


def test_a_normal_set_takes_the_gpu_back_and_the_job_runs_again_after(
    world: AgentHarness,
) -> None:
    marks, go = world.workdir / "marks", world.workdir / "go"
    _submit_preemptible(world, marks, go)
    # A normal request for GPU 1 passes: the preemptible job does not hold it.
    assert world.cli("set", "job=other", "gpus=1", f"host={HOST}").code == 0
    assert _holds(world, "pre")
    started = time.monotonic()
    taken = world.cli("set", "job=normal", "gpus=0", f"host={HOST}", "--wait=60s")
    waited = time.monotonic() - started
    assert taken.code == 0, taken.err
    assert waited <= 5 + PROPAGATION_S, waited
    assert _holds(world, "normal")
    assert any(r.startswith("preempted by normal") for r in _reasons(world, "pre"))
    wait_for("the preempted job back in the queue", lambda: "pre*" in _queued(world))
    assert world.events("batch-requeued", job="pre")
    assert world.cli("release", "job=normal").code == 0
    wait_for("the preempted job to run again", lambda: _starts(marks) == 2, timeout=30)
    assert _holds(world, "pre")
    go.write_text("go")
    wait_for("its end", lambda: world.events("batch-ended", job="pre"), timeout=30)
    assert not _holds(world, "pre")


def test_a_normal_run_takes_the_gpu_back_from_a_preemptible_run(world: AgentHarness) -> None:
    go = world.workdir / "go-run"
    script = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    argv = [sys.executable, "-m", "allocator", "run", "job=prun", "gpus=0", "grace=2s",
            "--preemptible", "--", sys.executable, "-c", script]  # fmt: skip
    held = subprocess.Popen(argv, env=world.env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the preemptible run to hold", lambda: held.poll() or _holds(world, "prun"))
        assert held.poll() is None, held.communicate()
        started = time.monotonic()
        taken = world.cli("run", "job=nrun", "gpus=0", "--wait=60s", "--", "true")
        waited = time.monotonic() - started
        assert taken.code == 0, taken.err
        assert waited <= 2 + PROPAGATION_S, waited
        _, err = held.communicate(timeout=30)
        assert held.returncode == 143, err
        assert "preempted by nrun" in err
        assert any(r.startswith("preempted by nrun") for r in _reasons(world, "prun"))
    finally:
        go.write_text("go")
        if held.poll() is None:
            held.kill()
            held.wait(10)


def test_a_normal_submitted_job_takes_the_gpu_back_and_the_preempted_one_follows(
    world: AgentHarness,
) -> None:
    marks, go = world.workdir / "marks", world.workdir / "go"
    _submit_preemptible(world, marks, go)
    normal_marks, normal_go = world.workdir / "normal-marks", world.workdir / "normal-go"
    result = world.cli(
        "submit", "job=main", "gpus=0", f"host={HOST}", "--",
        "/usr/bin/env", f"MARKS={normal_marks}", f"GO={normal_go}", sys.executable, "-c", SCRIPT,
    )  # fmt: skip
    assert result.code == 0, result.err
    wait_for("the normal job to run", lambda: _starts(normal_marks) == 1, timeout=30)
    assert world.events("batch-preempted", job="pre")
    assert "pre*" in _queued(world)
    assert _starts(marks) == 1  # it waits: the GPU is the normal job's
    normal_go.write_text("go")
    wait_for("the preempted job to run again", lambda: _starts(marks) == 2, timeout=30)
    go.write_text("go")
    wait_for("its end", lambda: world.events("batch-ended", job="pre"), timeout=30)


def test_a_job_that_ignores_sigterm_is_killed_after_its_grace(world: AgentHarness) -> None:
    marks = world.workdir / "stubborn"
    script = (
        "import os, pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "pathlib.Path(os.environ['MARKS']).write_text('started')\n"
        "while True: time.sleep(0.05)"
    )
    result = world.cli(
        "submit", "job=stubborn", "gpus=0", f"host={HOST}", "grace=1s", "--preemptible", "--",
        "/usr/bin/env", f"MARKS={marks}", sys.executable, "-c", script, str(world.workdir),
    )  # fmt: skip
    assert result.code == 0, result.err
    wait_for("the preemptible job to run", marks.exists, timeout=30)
    started = time.monotonic()
    taken = world.cli("set", "job=normal", "gpus=0", f"host={HOST}", "--wait=60s")
    waited = time.monotonic() - started
    assert taken.code == 0, taken.err
    assert 1 <= waited <= 1 + PROPAGATION_S, waited
    ended = [e for e in _history(world, "stubborn") if e.get("ended")]
    assert ended and ended[-1]["ended"]["exit_status"] == 137  # SIGKILL, after the grace


def _history(world: AgentHarness, job: str) -> list[dict[str, object]]:
    result = world.cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    entries: list[dict[str, object]] = json.loads(result.out)["entries"]
    return entries


def test_a_bad_grace_writes_nothing(world: AgentHarness) -> None:
    for grace in ("grace=soon", "grace=2h"):
        result = world.cli("submit", "gpus=0", f"host={HOST}", grace, "--preemptible", "--", "true")
        assert result.code == 2, result.err
        assert "grace=" in result.err
    assert _queued(world) == []
