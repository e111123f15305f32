"""A real agent and its GPUs: exclusive GPUs, what a restart remembers, NVML failing, ports.

These run against the embedded store only: what they test is the agent's
handling of its GPUs, which does not depend on the backend.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.types import AgentRecord, Assignment
from allocator.store import open_store
from tests.e2e.agent_harness import HOST, AgentHarness, _job, agent_policy, pid_alive
from tests.support.ports import colliding_job_names
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    """A world on the embedded store; the test applies its policy and starts the agent."""
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    try:
        yield harness
    finally:
        harness.cleanup()


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


def _put(world: AgentHarness, key_job: str, **fields: Any) -> None:
    """Write an assignment straight into the store, around `allocator set`'s checks."""
    body = Assignment(
        host=HOST, mode="gpu", updated_by="mallory@x", updated_at="2026-01-01T00:00:00Z", **fields
    )
    store = open_store(world.store_url)
    try:
        store.put(world.layout.assignment(HOST, key_job), body.to_json())
    finally:
        store.close()


def _delete(world: AgentHarness, key_job: str) -> None:
    store = open_store(world.store_url)
    try:
        store.delete(world.layout.assignment(HOST, key_job))
    finally:
        store.close()


def _agent_record(world: AgentHarness) -> AgentRecord | None:
    store = open_store(world.store_url)
    try:
        item = store.get(world.layout.agent(HOST))
    finally:
        store.close()
    return AgentRecord.from_json(item.value) if item else None


def _restart_agent(world: AgentHarness) -> AgentRecord:
    """kill -9 the agent, start it again, and wait until the new one has published.

    The new agent publishes after its first health check and reconcile, so
    whatever those decided is in its log when this returns.
    """
    assert world.stop_agent(signal.SIGKILL) == -signal.SIGKILL
    world.start_agent()
    assert world.process is not None
    pid = world.process.pid
    return wait_for(
        "the restarted agent's record",
        lambda: (r := _agent_record(world)) is not None and r.pid == pid and r,
    )


def _starts(world: AgentHarness, job: str) -> list[str]:
    return [e["device"] for e in world.events("start", job=job)]


# --- item 2: the key is the job's name; one job per GPU --------------------------------


def test_a_ghost_record_naming_another_job_starts_nothing_and_its_deletion_stops_nothing(
    world: AgentHarness,
) -> None:
    world.apply_policy()
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=1").code == 0
    train = world.new_report("train")
    _put(world, "ghost", job="train", gpus=(1,))  # under jobs/ghost, the body says train
    bad = wait_for("the ghost reported as a bad record", lambda: world.events("bad-record"))
    assert bad[-1]["key"].endswith("/jobs/ghost")
    status = world.cli("status")
    assert "disagrees with the key" in status.out + status.err
    _delete(world, "ghost")
    # The agent handles changes in order: once waiter starts, the deletion was seen.
    assert world.cli("set", "job=waiter", "gpus=2").code == 0
    world.new_report("waiter")
    assert world.report("train") == train and pid_alive(train["pid"])
    assert _starts(world, "train") == ["cuda"]


def test_a_job_written_onto_a_gpu_another_job_runs_on_is_refused_until_it_is_free(
    world: AgentHarness,
) -> None:
    world.apply_policy()
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=1").code == 0
    train = world.new_report("train")
    _put(world, "waiter", job="waiter", gpus=(1,))  # the same GPU, around the CLI's checks
    record = wait_for(
        "waiter refused",
        lambda: (r := world.worker_record("waiter")) is not None and r.state == "refused" and r,
    )
    assert "GPU 1 is also assigned to job 'train', which runs on it" in record.message
    status = world.cli("status", "-o", "json")
    assert "GPU 1 is also assigned to job 'train'" in status.out
    assert world.report("waiter") is None
    assert world.report("train") == train and pid_alive(train["pid"])

    assert world.cli("release", "job=train").code == 0
    waiter = world.new_report("waiter")  # GPU 1 is free: the refusal lifts
    assert waiter["env"]["CUDA_VISIBLE_DEVICES"] == _uuid(1)
    assert not pid_alive(train["pid"])


# --- item 7: what an agent restart remembers about its GPUs -----------------------------


def test_an_agent_restart_keeps_healthy_workers_and_remembers_a_gpu_it_took_out(
    world: AgentHarness,
) -> None:
    policy = agent_policy(world.workdir)
    policy["health"]["hold_down_seconds"] = 300  # GPU 1 stays held down across the restart
    world.gpus.update(0, ecc_uncorrected=7, ecc_uncorrected_aggregate=31)  # last month's errors
    world.apply_policy(policy)
    world.start_agent()
    assert world.cli("set", "job=waiter", "gpus=0").code == 0
    assert world.cli("set", "job=train", "gpus=1").code == 0
    waiter = world.new_report("waiter")
    on_gpu = world.new_report("train")
    assert waiter["env"]["CUDA_VISIBLE_DEVICES"] == _uuid(0)  # old ECC errors are no news

    world.gpus.add_xid(1, 79)
    on_cpu = world.new_report("train", not_pid=on_gpu["pid"])
    assert on_cpu["env"]["ALLOCATOR_DEVICE"] == "cpu"
    world.gpus.update(1, xid_events=[])  # NVML shows nothing of it any more
    stops = len(world.events("stop"))

    record = _restart_agent(world)
    assert list(record.unhealthy) == [1]  # still out: it failed, and is held down
    assert world.events("gpu-state-resumed")
    assert world.events("adopt")[-1]["adopted"] == ["train", "waiter"]
    for report in (waiter, on_cpu):  # neither the ECC count nor GPU 1 moved a worker
        assert pid_alive(report["pid"])
    assert _starts(world, "train") == ["cuda", "cpu"]
    assert _starts(world, "waiter") == ["cuda"]
    assert len(world.events("stop")) == stops


# --- item 9: NVML failing changes nothing -------------------------------------------------


def test_nvml_failing_on_sighup_and_at_start_restarts_no_worker(world: AgentHarness) -> None:
    world.apply_policy()
    world.start_agent()
    assert world.cli("set", "job=train", "gpus=1,2").code == 0
    report = world.new_report("train")
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == f"{_uuid(1)},{_uuid(2)}"

    world.gpus.system["nvml_error"] = "driver_not_loaded"
    world.gpus.save()
    assert world.process is not None
    os.kill(world.process.pid, signal.SIGHUP)
    failed = wait_for("the failed re-read", lambda: world.events("nvml-inventory-failed"))
    assert failed[-1]["kept_last_good"] is True
    assert "Driver Not Loaded" in failed[-1]["error"]
    wait_for("health checks to notice", lambda: world.events("nvml-health-failed"))

    record = _restart_agent(world)  # NVML still failing at start
    assert [gpu.uuid for gpu in record.gpus] == [_uuid(i) for i in range(4)]
    assert record.unhealthy == {}  # NVML failing is no verdict on any GPU

    del world.gpus.system["nvml_error"]
    world.gpus.save()
    assert world.process is not None
    os.kill(world.process.pid, signal.SIGHUP)  # re-open NVML now, not at the next retry
    wait_for("NVML back", lambda: world.events("nvml-inventory-recovered"))
    assert pid_alive(report["pid"]) and world.report("train") == report
    assert _starts(world, "train") == ["cuda"]
    assert not world.events("stop")


# --- item 11: MASTER_PORT per job, and the agent's master_addr ------------------------------


def test_per_gpu_jobs_never_share_a_master_port_and_env_shows_what_the_agent_gave(
    world: AgentHarness,
) -> None:
    first, second = colliding_job_names(2)  # their old, name-derived ports are the same
    policy = agent_policy(world.workdir)
    for name in (first, second):
        policy["jobs"][name] = _job(name, world.workdir, workers="per-gpu")
    world.apply_policy(policy)
    settings = world.workdir / "agent.yaml"
    settings.write_text("master_addr: 127.0.0.2\n")
    world.start_agent("--config", str(settings))
    assert world.cli("set", f"job={first}", "gpus=0").code == 0
    assert world.cli("set", f"job={second}", "gpus=1").code == 0
    envs = [world.new_report(name)["env"] for name in (first, second)]
    assert envs[0]["MASTER_PORT"] != envs[1]["MASTER_PORT"]
    assert {env["MASTER_ADDR"] for env in envs} == {"127.0.0.2"}

    for name, env in zip((first, second), envs, strict=True):
        wait_for(
            "the published port",
            lambda n=name: (r := world.worker_record(n)) is not None and r.master_port,
        )
        shown = world.cli("env", f"job={name}", "-o", "json")
        assert shown.code == 0, shown.err
        (worker,) = json.loads(shown.out)
        assert (worker["MASTER_ADDR"], worker["MASTER_PORT"]) == (
            env["MASTER_ADDR"],
            env["MASTER_PORT"],
        )
