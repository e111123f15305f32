"""The agent never runs a job twice or on the wrong GPU, whatever its records went through.

A real agent (SQLite store, fake GPUs, real workers), three faults in turn:

* ``full-disk``: its state directory is a small tmpfs, filled to the last
  byte; a job assigned then must not start (it waits, and says why in its
  worker record), the agent is killed with SIGKILL and restarted, and once
  there is room again the job starts once (root only: skipped elsewhere);
* ``mid-handover``: the agent is frozen in the middle of handing a worker to
  its shim (``ALLOCATOR_TEST_PAUSE_AT=handover``) and killed with SIGKILL
  there; the shim starts nothing, and the restarted agent starts the job
  once, with its whole environment;
* ``unreadable-state``: the agent is killed, its state file cut short or
  stamped with a newer ``schema_version``, and restarted: it adopts every
  worker from the shims' status files (same processes) and restarts nothing.

Throughout, each job's worker holds a lock of its own (a second copy would
not get it at once) and no job ever has two live workers; every worker's
``CUDA_VISIBLE_DEVICES`` is its assigned GPU's UUID. ``make soak`` runs
more cycles; the figures report duplicates and workers on a wrong GPU.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import DUMMY, AgentHarness, agent_policy, processes_running
from tests.reliability.conftest import Figures, scale
from tests.support.full_disk import fill, small_tmpfs
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")

CYCLES = scale(1, 4)
GPUS = {"steady": 0, "train": 1}


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def _job(workdir: Path, name: str) -> dict[str, Any]:
    lock = ("--lock", str(workdir / f"{name}.lock"))
    command = [sys.executable, str(DUMMY), "--out", str(workdir / f"{name}.json"), *lock]
    return {"command": command, "grace_seconds": 1}


class Records:
    """One run's world and what it saw."""

    def __init__(self, world: AgentHarness, full_disk: bool) -> None:
        self.world = world
        self.full_disk = full_disk
        self.duplicates = 0
        self.wrong_gpu = 0
        self.cycles = 0
        self.steady_pid = 0
        self.mark = 0

    @property
    def state_dir(self) -> Path:
        return self.world.workdir / "agent"

    def set(self, job: str) -> None:
        result = self.world.cli("set", f"job={job}", f"gpus={GPUS[job]}")
        assert result.code == 0, result.err

    def release(self, job: str) -> None:
        result = self.world.cli("release", f"job={job}")
        assert result.code in (0, 6), result.err

    def workers(self, job: str) -> list[int]:
        return list(processes_running(str(self.world.workdir / f"{job}.json")))

    def check(self) -> None:
        """No job runs twice; every worker that reported runs on its own GPU, got its lock."""
        for job in GPUS:
            running = self.workers(job)
            if len(running) > 1:
                self.duplicates += 1
                raise AssertionError(f"{job} runs twice: {running}")
            report = self.world.report(job)
            if report is None or report["pid"] not in running:
                continue
            if report["lock_acquired_at_once"] is False:
                self.duplicates += 1
            if report["env"].get("CUDA_VISIBLE_DEVICES") != _uuid(GPUS[job]):
                self.wrong_gpu += 1

    def running_once(self, job: str) -> int:
        """Wait for ``job`` to run exactly one worker that reported; return its pid."""

        def one() -> int | None:
            self.check()
            report, running = self.world.report(job), self.workers(job)
            if report is not None and running == [report["pid"]]:
                return int(report["pid"])
            return None

        return int(wait_for(f"{job} to run once", one, timeout=30, every=0.05))

    def restart(self, **env: str) -> None:
        self.mark = len(self.world.log_events())
        self.world.start_agent(env=env)
        wait_for("adoption", lambda: self.events_since("adopt"))

    def events_since(self, name: str) -> list[dict[str, Any]]:
        """The agent's ``name`` events since the last restart."""
        return [e for e in self.world.log_events()[self.mark :] if e["event"] == name]

    def kill_agent(self) -> None:
        self.world.stop_agent(signal.SIGKILL)

    def clear_train(self) -> None:
        self.release("train")
        wait_for("train to be gone", lambda: not self.workers("train") and self.check() is None)
        # Forgotten (its record deleted) only once its files are: nothing frees room later.
        wait_for("train's record to go", lambda: self.world.worker_record("train") is None, 30)
        (self.world.workdir / "train.json").unlink(missing_ok=True)

    # --- the faults -----------------------------------------------------------------

    def full_disk_cycle(self) -> None:
        filler = fill(self.state_dir)
        self.set("train")

        def held() -> bool:
            self.check()
            record = self.world.worker_record("train")
            return record is not None and record.state == "waiting"

        wait_for("train to wait for room", held, timeout=30)
        record = self.world.worker_record("train")
        assert record is not None and "No space left on device" in record.message
        assert self.workers("train") == []
        self.kill_agent()
        self.restart()
        assert self.workers("train") == []  # still no room: still nothing
        filler.unlink()
        self.running_once("train")

    def mid_handover_cycle(self) -> None:
        self.kill_agent()
        self.restart(ALLOCATOR_TEST_PAUSE_AT="handover")
        self.set("train")
        wait_for("the agent to freeze mid hand-over", lambda: "paused at handover" in self.log())
        self.kill_agent()
        wait_for("the cut-off shim to end", lambda: not self.shims_of("train"), timeout=30)
        assert self.workers("train") == []  # it started nothing
        self.restart()
        pid = self.running_once("train")
        assert pid > 0

    def unreadable_state_cycle(self, how: str) -> None:
        self.set("train")
        train = self.running_once("train")
        self.kill_agent()
        path = self.state_dir / "workers.json"
        if how == "truncated":
            text = path.read_text()
            path.write_text(text[: len(text) // 3])
        else:
            data = json.loads(path.read_text())
            data["schema_version"] = 99
            path.write_text(json.dumps(data))
        self.restart()
        assert self.events_since("state-unreadable")
        assert self.running_once("train") == train  # adopted, not started again

    def log(self) -> str:
        return self.world.log_text()

    def shims_of(self, job: str) -> list[int]:
        return [
            pid
            for pid in processes_running(str(self.state_dir), shims=True)
            if f"/{job}." in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        ]


@pytest.fixture
def records(tmp_path: Path, prefix: str) -> Iterator[Records]:
    world = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    with small_tmpfs(tmp_path / "agent", "2m") as why_not:
        policy = agent_policy(tmp_path)
        policy["jobs"] = {name: _job(tmp_path, name) for name in GPUS}
        try:
            world.apply_policy(policy)
            world.start_agent()
            harness = Records(world, full_disk=not why_not)
            harness.set("steady")
            harness.steady_pid = harness.running_once("steady")
            yield harness
        finally:
            world.cleanup()


def test_full_disks_cut_hand_overs_and_unreadable_state_never_run_a_job_twice(
    records: Records, figures: Figures
) -> None:
    faults = ["mid-handover", "truncated", "newer"]
    if records.full_disk:
        faults.insert(0, "full-disk")
    try:
        for _ in range(CYCLES):
            for fault in faults:
                if fault == "full-disk":
                    records.full_disk_cycle()
                elif fault == "mid-handover":
                    records.mid_handover_cycle()
                else:
                    records.unreadable_state_cycle(fault)
                assert records.running_once("steady") == records.steady_pid  # never touched
                records.clear_train()
                records.cycles += 1
    finally:
        figures.add("faults", ",".join(faults) + ("" if records.full_disk else " (no tmpfs)"))
        figures.add("cycles", f"{records.cycles}/{CYCLES * len(faults)}")
        figures.add("duplicate workers", records.duplicates)
        figures.add("workers on a wrong GPU", records.wrong_gpu)
    assert (records.duplicates, records.wrong_gpu) == (0, 0)
    if not records.full_disk:
        pytest.skip("the full-disk case needs a tmpfs mount (root); the others ran")
