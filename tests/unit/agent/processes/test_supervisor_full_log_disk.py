"""A full disk under the workers' logs: the job waits and says why, then starts once there is room.

Like a full state disk, this is an ordinary condition of a training host,
not the job's fault: no worker is started, nothing counts as a crash (so the
job is never given up on), and the start is tried again later. The full
disk is a real one: a small tmpfs mounted for the test and filled (root only).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.planning.reconcile import plan
from allocator.agent.processes.supervisor import RECORD_RETRY_SECONDS, Supervisor
from tests.support.clock import FakeClock
from tests.support.full_disk import fill, small_tmpfs
from tests.support.supervision import AGENT_ENV, job_spec, kill_reported, poll, processes_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


@pytest.fixture
def log_dir(tmp_path: Path) -> Iterator[Path]:
    """The workers' log directory on a small tmpfs (skipped where mounting is refused)."""
    mount = tmp_path / "logs"
    with small_tmpfs(mount, "256k") as why_not:
        if why_not:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {why_not}")
        yield mount


@pytest.fixture
def supervised(tmp_path: Path, log_dir: Path) -> Iterator[tuple[Supervisor, FakeClock, list[str]]]:
    clock, events = FakeClock(), []
    sup = Supervisor(
        log_dir,
        tmp_path / "state" / "workers.json",
        base_env=AGENT_ENV,
        clock=clock,
        logger=lambda name, fields: events.append(json.dumps({"event": name, **fields})),
        cgroups=False,
        warm_shim=False,
    )
    try:
        yield sup, clock, events
    finally:
        sup.stop_all(grace=0)
        kill_reported(tmp_path)


def _report(path: Path) -> dict[str, Any] | None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return None


def test_a_full_log_disk_holds_the_start_until_there_is_room(
    tmp_path: Path, log_dir: Path, supervised: tuple[Supervisor, FakeClock, list[str]]
) -> None:
    sup, clock, events = supervised
    spec = job_spec(tmp_path, max_restarts=1)
    filler = fill(log_dir)
    for _ in range(3):  # as many tries as a crash loop would need to give up
        for action in plan({"train": spec}, sup.views(), clock()):
            sup.apply(action)
        sup.tick()
        clock.advance(RECORD_RETRY_SECONDS)
    record = sup.records()["train"]
    assert record["state"] == "waiting", record
    assert "No space left on device" in record["message"]
    assert (record["restarts"], record["crash_restarts"]) == (0, 0)
    assert not [e for e in events if '"worker-started"' in e]
    filler.unlink()
    for action in plan({"train": spec}, sup.views(), clock()):
        sup.apply(action)
    out = tmp_path / "reports" / "train.0.json"
    report = poll(lambda: _report(out), "the worker's report")
    assert processes_running(out) == [report["pid"]]
    assert sup.records()["train"]["state"] == "running"
