"""A real agent watching GPU use through the fake NVML: metrics, unassigned processes, idle release.

One agent per backend (SQLite and a real etcd) goes through it all: after a
``set`` its ``/metrics`` answers with the job on its GPU; a process of
nobody's on a GPU shows in ``status``; a job idle past its policy rule is
released, with the reason in the agent's log.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy
from tests.support.etcd_server import free_port
from tests.support.prometheus import Scrape, parse_exposition
from tests.support.waiting import wait_for


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix)
    try:
        yield harness
    finally:
        harness.cleanup()


def _scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return parse_exposition(response.read().decode())


def _status(world: AgentHarness) -> dict[str, object]:
    result = world.cli("status", "-o", "json")
    assert result.code == 0, result.err
    data: dict[str, object] = json.loads(result.out)
    return data


@pytest.mark.slow
def test_metrics_unassigned_use_and_idle_release_end_to_end(
    world: AgentHarness, stranger: subprocess.Popen[bytes]
) -> None:
    policy = agent_policy(world.workdir)
    policy["jobs"]["waiter"]["idle"] = {"after": "2s", "action": "release"}
    world.apply_policy(policy)
    world.gpus.update(1, utilization_gpu=90, memory_used_mib=1024)
    port = free_port()
    world.start_agent("--metrics-port", str(port), "--metrics-address", "127.0.0.1")

    assert world.cli("set", "job=train", "gpus=1").code == 0
    train = world.new_report("train")["pid"]
    gpu1 = {"host": HOST, "gpu": "1", "uuid": "GPU-00000000-0000-4000-8000-000000000001"}

    def metrics_show_train() -> Scrape | None:
        scrape = _scrape(port)
        ready = scrape.value("allocator_workers_running", host=HOST, job="train") == 1.0
        return scrape if ready else None

    scrape = wait_for("the metrics to show train running", metrics_show_train)
    assert scrape.value("allocator_gpus", host=HOST, state="assigned") == 1.0
    assert scrape.value("allocator_gpus", host=HOST, state="free") == 3.0
    assert scrape.value("allocator_gpu_utilization_ratio", job="train", **gpu1) == 0.9
    assert scrape.value("allocator_gpu_memory_used_bytes", job="train", **gpu1) == 2**30
    assert scrape.value("allocator_store_up", host=HOST) == 1.0

    # Train on its own GPU is fine; the notebook on GPU 3 is nobody's.
    world.gpus.update(1, processes=[{"pid": train, "used_memory_mib": 1000}])
    world.gpus.update(3, processes=[{"pid": stranger.pid, "used_memory_mib": 2048}])

    def unassigned() -> list[dict[str, object]] | None:
        (host,) = _status(world)["hosts"]  # type: ignore[misc]
        found = [p for g in host["gpus"] for p in g["unassigned"]]
        return found or None

    found = wait_for("status to show the process on GPU 3", unassigned)
    assert [(p["pid"], p["job"], p["memory_used_mib"]) for p in found] == [
        (stranger.pid, None, 2048)
    ]
    text = world.cli("status").out
    assert f"{HOST} GPU 3: pid {stranger.pid}" in text and "signal.pause" in text
    assert _scrape(port).value("allocator_gpu_unassigned_processes", host=HOST, gpu="3") == 1.0

    # waiter's GPU stays at 0 %: after 2 s its rule releases it.
    assert world.cli("set", "job=waiter", "gpus=2").code == 0
    world.new_report("waiter")
    wait_for("waiter to be released", lambda: world.cli("get", "job=waiter").code == 6)
    (released,) = world.events("idle-released", job="waiter")
    assert str(released["reason"]).startswith("idle for 2s (policy idle rule on job waiter)")
    assert world.cli("get", "job=train").code == 0  # busy: kept
