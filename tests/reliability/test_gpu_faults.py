"""GPU faults through the fake NVML, with a real agent: each fallback rule, and flapping.

* XID on a ``cpu``-rule job's GPU: it moves to CPU and back, every time the
  GPU fails, recovers and fails again;
* uncorrected ECC errors on a ``wait``-rule job's GPU: it stops until the GPU
  is back;
* a lost GPU under a ``fail``-rule job: it fails, and stays failed;
* a GPU flapping healthy/unhealthy: its job is restarted a bounded number of
  times (hold-down, then the flap limit), and returns once the GPU is stable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.records.types import WorkerRecord
from tests.e2e.agent_harness import AgentHarness, _job, agent_policy, pid_alive
from tests.reliability.conftest import Figures, scale
from tests.support.waiting import wait_for

FLAP_LIMIT = 3
HOLD_DOWN = 0.1  # doubling: 0.1, 0.2, 0.4, 0.8, 1.6, 2.0 s
STABLE_AFTER = 2.0  # hold_down_max_seconds: the cap, and how long "stable" is


def _policy(workdir: Path) -> dict[str, Any]:
    policy = agent_policy(workdir)
    policy["jobs"]["failer"] = _job("failer", workdir, fallback="fail")
    policy["jobs"]["flapper"] = _job("flapper", workdir, fallback="cpu-2")
    policy["fallback"]["fail"] = {"action": "fail"}
    policy["health"] = {
        "interval_seconds": 0.1,
        "hold_down_seconds": HOLD_DOWN,
        "hold_down_max_seconds": STABLE_AFTER,
        "flap_restart_limit": FLAP_LIMIT,
    }
    return policy


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    try:
        harness.apply_policy(_policy(tmp_path))
        harness.gpus.update(1, ecc_uncorrected=0)  # GPU 1 reports ECC: its baseline is 0
        harness.start_agent()  # returns once the agent has checked its GPUs and published
        yield harness
    finally:
        harness.cleanup()


def _record_in(world: AgentHarness, job: str, state: str) -> WorkerRecord | None:
    record = world.worker_record(job)
    return record if record is not None and record.state == state else None


def _device(report: dict[str, Any]) -> str:
    return str(report["env"]["ALLOCATOR_DEVICE"])


def _gpu_events(world: AgentHarness, gpu: int, *names: str) -> int:
    return sum(len(world.events(name, gpu=gpu)) for name in names)


def test_each_fallback_rule_is_applied_and_a_gpu_failing_again_is_handled_each_time(
    world: AgentHarness, figures: Figures
) -> None:
    for job, gpu in (("train", 0), ("waiter", 1), ("failer", 2)):
        assert world.cli("set", f"job={job}", f"gpus={gpu}").code == 0
    report = world.new_report("train")
    waiter = world.new_report("waiter")
    failer = world.new_report("failer")

    # fail: a lost GPU fails the job, which stays failed after the GPU returns.
    world.gpus.update(2, lost=True)
    wait_for("failer failed", lambda: _record_in(world, "failer", "failed"), timeout=20)
    (why,) = world.events("job-failed", job="failer")
    assert "GPU 2 unhealthy" in str(why["reason"])
    wait_for("failer's worker to stop", lambda: not pid_alive(failer["pid"]))
    world.gpus.update(2, lost=None)

    # wait: uncorrected ECC errors stop the job until the GPU is back.
    world.gpus.update(1, ecc_uncorrected=2)
    waiting = wait_for("waiter waiting", lambda: _record_in(world, "waiter", "wait"), timeout=20)
    assert "uncorrected ECC errors: 2 (was 0)" in waiting.message
    world.new_report("waiter", not_pid=waiter["pid"], timeout=20)

    # cpu: XIDs move the job to CPU and back, each time the GPU fails again.
    cycles = scale(2, 10)
    for _ in range(cycles):
        world.gpus.add_xid(0, 79)
        report = world.new_report("train", not_pid=report["pid"], timeout=20)
        assert _device(report) == "cpu" and "XID 79" in report["env"]["ALLOCATOR_FALLBACK_REASON"]
        report = world.new_report("train", not_pid=report["pid"], timeout=20)
        assert _device(report) == "cuda"
    assert _record_in(world, "failer", "failed") is not None  # still failed
    figures.add("XID fail/recover cycles", cycles)
    figures.add("train starts", len(world.events("start", job="train")))


def test_a_flapping_gpu_restarts_its_job_a_bounded_number_of_times(
    world: AgentHarness, figures: Figures
) -> None:
    assert world.cli("set", "job=flapper", "gpus=3").code == 0
    first = world.new_report("flapper")
    flaps = scale(5, 50)
    for _ in range(flaps):  # unhealthy, then healthy until its hold-down is over: again
        failures = _gpu_events(world, 3, "gpu-out", "gpu-failed-in-hold-down")
        world.gpus.update(3, healthy=False)
        wait_for(
            "the agent to see GPU 3 fail",
            lambda n=failures: _gpu_events(world, 3, "gpu-out", "gpu-failed-in-hold-down") > n,
        )
        returns = _gpu_events(world, 3, "gpu-returned")
        world.gpus.update(3, healthy=None)
        wait_for(
            "GPU 3 back in service",
            lambda n=returns: _gpu_events(world, 3, "gpu-returned") > n,
        )
    assert world.events("job-flap-limit", job="flapper")
    pinned = wait_for(
        "the record to say why the job stays on CPU",
        lambda: (r := world.worker_record("flapper")) and "flapped" in r.message and r,
    )
    assert pinned.device == "cpu" and pinned.state == "running"
    caused = len(world.events("start", job="flapper")) - 1
    # Off the GPU and back counts against the limit; moving off is never refused.
    assert caused <= FLAP_LIMIT + 1

    back = world.new_report("flapper", not_pid=pinned.pids[0], timeout=30)  # stable: returns
    assert _device(back) == "cuda" and not pid_alive(first["pid"])
    figures.add("flaps injected", flaps)
    figures.add("restarts caused (flapping)", caused)
    figures.add("restarts caused (incl. return when stable)", caused + 1)
