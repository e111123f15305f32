"""The host agent as a real process: workers started, moved, stopped, restarted, adopted."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from allocator.records.types import Assignment
from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, pid_alive, processes_running
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    """A policy applied, an agent running on a fake host with 4 GPUs."""
    with AgentHarness(tmp_path, store_url, prefix).running() as harness:
        yield harness


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def test_set_starts_a_worker_with_its_gpus_in_order(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=3,1").code == 0
    report = world.new_report("train", timeout=5)
    env = report["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == f"{_uuid(3)},{_uuid(1)}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["ALLOCATOR_GPUS"] == "3,1" and env["ALLOCATOR_DEVICE"] == "cuda"
    assert report["sid"] == report["pgid"] == report["ppid"]  # its shim's own session and group
    record = wait_for("a running worker record", lambda: _running(world, "train"))
    assert record.pids == (report["pid"],) and record.gpus == (3, 1)
    log = (world.workdir / "agent" / "logs" / "train.log").read_text()
    assert "(stdout)" in log and "(stderr)" in log


def test_moving_a_job_replaces_its_worker_only_after_the_old_one_is_gone(
    world: AgentHarness,
) -> None:
    assert world.cli("set", "job=train", "gpus=1,3").code == 0
    first = world.new_report("train")
    assert world.cli("set", "job=train", "gpus=2").code == 0
    second = world.new_report("train", not_pid=first["pid"])
    assert second["lock_acquired_at_once"] is True  # the old worker no longer held the job lock
    assert not pid_alive(first["pid"])
    assert second["env"]["CUDA_VISIBLE_DEVICES"] == _uuid(2)


def test_unrelated_changes_do_not_touch_a_running_job(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=0").code == 0
    first = world.new_report("train")
    assert world.cli("set", "job=waiter", "gpus=1").code == 0
    world.new_report("waiter")
    assert world.cli("release", "job=waiter").code == 0
    wait_for("waiter's record to go", lambda: world.worker_record("waiter") is None)
    assert world.report("train") == first and pid_alive(first["pid"])


def test_release_stops_the_worker(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=0").code == 0
    pid = world.new_report("train")["pid"]
    assert world.cli("release", "job=train").code == 0
    wait_for("the worker to stop", lambda: not pid_alive(pid))
    wait_for("the worker record to go", lambda: world.worker_record("train") is None)


def test_a_worker_ignoring_sigterm_is_killed_with_its_children(world: AgentHarness) -> None:
    assert world.cli("set", "job=stubborn", "gpus=0").code == 0
    report = world.new_report("stubborn")
    assert pid_alive(report["child_pid"])
    assert world.cli("release", "job=stubborn").code == 0
    wait_for("the stubborn worker to die", lambda: not pid_alive(report["pid"]), timeout=10)
    wait_for("its child to die", lambda: not pid_alive(report["child_pid"]), timeout=10)


def test_a_crashing_worker_backs_off_and_stops_at_the_limit(world: AgentHarness) -> None:
    assert world.cli("set", "job=crashy", "gpus=0").code == 0

    def gave_up() -> object:
        record = world.worker_record("crashy")
        return record if record is not None and record.state == "gave-up" else None

    record = wait_for("the crash-loop limit", gave_up, timeout=20)
    assert record.crash_restarts == 2
    assert record.last_exit == 1
    starts = world.events("start", job="crashy")
    assert [e["cause"] for e in starts] == ["new", "crash", "crash"]


def test_per_gpu_workers_each_see_one_gpu_with_ranks(world: AgentHarness) -> None:
    assert world.cli("set", "job=ranks", "gpus=2,0").code == 0
    record = wait_for(
        "two workers", lambda: (r := _running(world, "ranks")) and len(r.pids) == 2 and r
    )
    assert record.gpus == (2, 0)


def test_an_unhealthy_gpu_moves_its_job_to_cpu_and_back(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=1").code == 0
    on_gpu = world.new_report("train")
    world.gpus.update(1, healthy=False)
    on_cpu = world.new_report("train", not_pid=on_gpu["pid"])
    assert on_cpu["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert on_cpu["env"]["ALLOCATOR_DEVICE"] == "cpu"
    assert on_cpu["env"]["OMP_NUM_THREADS"] == "2"
    assert "GPU 1" in on_cpu["env"]["ALLOCATOR_FALLBACK_REASON"]
    world.gpus.update(1, healthy=True)
    back = world.new_report("train", not_pid=on_cpu["pid"])
    assert back["env"]["CUDA_VISIBLE_DEVICES"] == _uuid(1)
    # Exactly three starts: on the GPU, on CPU, back on the GPU (recovery checks
    # in between must not restart the CPU worker).
    starts = world.events("start", job="train")
    assert [e["device"] for e in starts] == ["cuda", "cpu", "cuda"]


def test_wait_rule_stops_the_job_until_the_gpu_is_healthy(world: AgentHarness) -> None:
    assert world.cli("set", "job=waiter", "gpus=2").code == 0
    first = world.new_report("waiter")
    world.gpus.update(2, xid_events=[79])
    wait_for("the waiter to stop", lambda: not pid_alive(first["pid"]))
    record = wait_for(
        "a wait record", lambda: (r := world.worker_record("waiter")) and r.state == "wait" and r
    )
    assert "GPU 2" in record.message
    world.gpus.update(2, xid_events=[])
    world.new_report("waiter", not_pid=first["pid"])


def test_an_ad_hoc_command_the_policy_does_not_allow_is_refused(world: AgentHarness) -> None:
    refused = world.cli("set", "job=train", "gpus=0", "command=sh -c 'rm -rf /tmp/x'")
    assert refused.code == 2 and "ad-hoc" in refused.err
    # Someone with write access to the store bypasses the CLI: the agent refuses too.
    sneaky = Assignment(
        job="train",
        host=HOST,
        gpus=(0,),
        mode="gpu",
        updated_by="mallory@x",
        updated_at="2026-01-01T00:00:00Z",
        command=("sh", "-c", "touch pwned"),
    )
    store = open_store(world.store_url)
    try:
        store.put(world.layout.assignment(HOST, "train"), sneaky.to_json())
    finally:
        store.close()
    record = wait_for(
        "a refused record",
        lambda: (r := world.worker_record("train")) and r.state == "refused" and r,
    )
    assert "ad-hoc" in record.message
    assert world.report("train") is None


def test_kill_9_and_restart_runs_exactly_one_copy(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=0").code == 0
    report = world.new_report("train")
    assert world.stop_agent(signal.SIGKILL) == -signal.SIGKILL
    assert pid_alive(report["pid"])  # workers live in their own sessions
    world.start_agent()
    adopted = wait_for(
        "adoption",
        lambda: [e for e in world.events("adopt") if e["adopted"]],
    )
    assert adopted[-1]["adopted"] == ["train"]
    record = wait_for("the adopted worker's record", lambda: _running(world, "train"))
    assert record.pids == (report["pid"],)
    assert list(processes_running(str(world.workdir / "train.json"))) == [report["pid"]]
    assert world.report("train") == report


def test_sigterm_stops_workers_unless_told_to_keep_them(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=0").code == 0
    pid = world.new_report("train")["pid"]
    assert world.stop_agent() == 0
    assert not pid_alive(pid)
    wait_for("the agent record to go", lambda: not world.agent_record_present())

    world.start_agent("--keep-workers-on-exit")
    kept = world.new_report("train", not_pid=pid)["pid"]
    assert world.stop_agent() == 0
    assert pid_alive(kept)


def _running(world: AgentHarness, job: str) -> object:
    record = world.worker_record(job)
    return record if record is not None and record.state == "running" and record.pids else None


def test_sighup_reloads_settings_without_restarting_workers(world: AgentHarness) -> None:
    settings = world.workdir / "agent.yaml"
    settings.write_text("resync_seconds: 30\n")
    assert world.stop_agent() == 0
    world.start_agent("--config", str(settings))
    assert world.cli("set", "job=train", "gpus=0").code == 0
    report = world.new_report("train")
    assert world.process is not None

    settings.write_text("resync_seconds: 7\n")
    os.kill(world.process.pid, signal.SIGHUP)
    applied = wait_for("the new settings", lambda: world.events("settings"))
    assert applied[-1]["resync_seconds"] == "7.0"

    settings.write_text("resync_secnds: 7\n")  # a typo: refused, the agent carries on
    os.kill(world.process.pid, signal.SIGHUP)
    refused = wait_for("the refusal", lambda: world.events("reload-refused"))
    assert "did you mean 'resync_seconds'" in refused[-1]["error"]
    assert world.process.poll() is None
    assert pid_alive(report["pid"]) and world.report("train") == report


def _idle_shims(world: AgentHarness) -> list[int]:
    """The agent's idle shims: ``--idle`` and its state directory, and no worker below them.

    (A shim that was handed a worker keeps the command line it started with.)
    """
    found = []
    for pid in processes_running(str(world.workdir / "agent"), shims=True):
        with suppress(psutil.Error):
            process = psutil.Process(pid)
            if "--idle" in process.cmdline() and not process.children():
                found.append(pid)
    return found


def test_kill_9_leaves_no_idle_shim_and_the_next_agent_keeps_one(world: AgentHarness) -> None:
    first = wait_for("an idle shim", lambda: _idle_shims(world))
    assert len(first) == 1
    assert world.cli("set", "job=train", "gpus=0").code == 0
    worker = world.new_report("train")["pid"]  # started through the idle shim
    second = wait_for("a new idle shim", lambda: [p for p in _idle_shims(world) if p not in first])
    assert world.stop_agent(signal.SIGKILL) == -signal.SIGKILL
    wait_for("the idle shim to end with its agent", lambda: not _idle_shims(world))
    assert pid_alive(worker)  # the worker's shim is no idle one: it stays
    world.start_agent()
    third = wait_for("the new agent's idle shim", lambda: _idle_shims(world))
    assert len(third) == 1 and third[0] not in second
    assert world.new_report("train")["pid"] == worker  # adopted, not restarted
