"""A GPU NVML says recovered goes back to its job only once the policy's probe passes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness, agent_policy, pid_alive
from tests.support.waiting import wait_for

# Fails while the marker file exists: a stand-in for "cannot create a CUDA context".
PROBE = "import os, sys; sys.exit(1 if os.path.exists(sys.argv[1]) else 0)"


@pytest.fixture
def probed(tmp_path: Path, prefix: str) -> Iterator[tuple[AgentHarness, Path]]:
    world = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    marker = tmp_path / "gpu-still-broken"
    policy: dict[str, Any] = agent_policy(tmp_path)
    policy["health"] = {
        "interval_seconds": 0.2,  # a failed probe is retried after 30 intervals: 6 s
        "recovery_probe": [sys.executable, "-c", PROBE, str(marker)],
        "recovery_probe_timeout_seconds": 10,
        "hold_down_seconds": 0.5,
    }
    try:
        world.apply_policy(policy)
        world.start_agent()
        yield world, marker
    finally:
        world.cleanup()


def test_a_failing_probe_keeps_the_job_on_cpu_until_the_gpu_passes(
    probed: tuple[AgentHarness, Path],
) -> None:
    world, marker = probed
    assert world.cli("set", "job=train", "gpus=1").code == 0
    on_gpu = world.new_report("train")

    marker.touch()
    world.gpus.update(1, xid_events=[79])
    on_cpu = world.new_report("train", not_pid=on_gpu["pid"])
    assert on_cpu["env"]["CUDA_VISIBLE_DEVICES"] == ""

    # XIDs are one-shot: NVML soon reports the GPU clean, but the probe says no.
    wait_for(
        "a failed re-test",
        lambda: world.events("gpu-retest-failed", gpu=1),
    )
    assert pid_alive(on_cpu["pid"]) and world.report("train") == on_cpu

    marker.unlink()
    back = world.new_report("train", not_pid=on_cpu["pid"], timeout=30)
    assert back["env"]["CUDA_VISIBLE_DEVICES"].endswith("000000000001")
    assert world.events("gpu-recovered", gpu=1)
    starts = [e["device"] for e in world.events("start", job="train")]
    assert starts == ["cuda", "cpu", "cuda"]  # probing never restarted the CPU worker
