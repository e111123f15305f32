"""A reservation holds from its start: the agent moves a holder it does not cover, by its clock."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from allocator.util.times import format_time
from tests.e2e.agent_harness import HOST, AgentHarness, agent_policy


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    """An agent on a fake 4-GPU host, with the embedded store (the window is what is tested)."""
    with AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix).running() as harness:
        yield harness


def test_a_holder_loses_a_reserved_gpu_when_the_window_opens(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=2,3").code == 0
    first = world.new_report("train")
    assert first["env"]["ALLOCATOR_DEVICE"] == "cuda"

    # Reserve GPU 3 for other jobs from two seconds from now, and re-apply: the
    # holder keeps it until then, and nothing else changes when the window opens.
    start = datetime.now(UTC) + timedelta(seconds=2)
    policy = agent_policy(world.workdir)
    policy["jobs"]["eval-x"] = {"command": ["true"]}
    policy["reservations"] = [
        {"name": "eval", "host": HOST, "gpus": [3], "for": ["eval-*"], "start": format_time(start)}
    ]
    path = world.workdir / "reserved.yaml"
    path.write_text(json.dumps(policy))  # JSON is YAML
    applied = world.cli("policy", "apply", str(path), "--force")
    assert applied.code == 0, applied.err

    moved = world.new_report("train", not_pid=first["pid"], timeout=20)
    env = moved["env"]
    assert env["ALLOCATOR_DEVICE"] == "cpu" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["ALLOCATOR_FALLBACK_REASON"].startswith("GPU 3 reserved by 'eval' for eval-*")
    assert datetime.now(UTC) >= start.replace(microsecond=0)

    status = world.cli("status")
    assert status.code == 0
    assert "HELD OUTSIDE IT ('train' is not in reservation 'eval')" in status.out
