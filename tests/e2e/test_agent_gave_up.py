"""Why a job gave up, from a real agent: its failed worker's last lines in status and get.

The worker prints a traceback-like error (with a terminal escape and a
secret from its environment) and exits 1; with ``max_restarts: 0`` the agent
gives up at once and publishes the end of the worker's log in its record.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from allocator.store.credentials import MASK
from tests.e2e.agent_harness import AgentHarness, agent_policy
from tests.support.waiting import wait_for

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"
SECRET = "s3cr3t-wandb-token-0123456789"
FAIL = "; ".join(
    [
        "import sys",
        "[print(f'loading shard {i}') for i in range(20)]",
        "print('\\x1b[31mTraceback (most recent call last):')",
        "print('token', sys.argv[1])",
        "print('GpuUnavailableError: no CUDA device: torch is a CPU-only build', file=sys.stderr)",
        "sys.exit(1)",
    ]
)


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, store_url, prefix)
    policy = agent_policy(tmp_path)
    policy["jobs"]["failing"] = {
        "command": [sys.executable, "-c", FAIL, SECRET],
        "env": {"WANDB_API_KEY": SECRET},
        "max_restarts": 0,
        "grace_seconds": 1,
    }
    with harness.running(policy=policy):
        yield harness


def _row(world: AgentHarness) -> dict[str, Any] | None:
    result = world.cli("status", "-o", "json")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    Draft202012Validator(json.loads((SCHEMAS / "status.schema.json").read_text())).validate(
        document
    )
    rows = [j for h in document["hosts"] for j in h["jobs"] if j["job"] == "failing"]
    return rows[0] if rows and rows[0]["output_tail"] else None


@pytest.mark.slow
def test_status_and_get_show_why_a_job_gave_up(world: AgentHarness) -> None:
    assert world.cli("set", "job=failing", "gpus=0").code == 0
    row = wait_for("the gave-up job's last output in status", lambda: _row(world))
    tail = row["output_tail"]
    assert tail[-1] == "GpuUnavailableError: no CUDA device: torch is a CPU-only build"
    assert len(tail) == 10 and tail[0] == "loading shard 13"
    assert "\\x1b[31mTraceback (most recent call last):" in tail  # escaped, not sent raw
    assert tail[-2] == f"token {MASK}"
    assert SECRET not in json.dumps(row)
    assert row["log_path"].endswith("failing.log") and "gave-up" in row["workers"]

    text = world.cli("status").out
    assert "gave up, last output:" in text
    assert "    | GpuUnavailableError: no CUDA device: torch is a CPU-only build" in text
    assert "\x1b" not in text and SECRET not in text

    shown = world.cli("get", "job=failing")
    assert shown.code == 0 and "CPU-only build" in shown.out and row["log_path"] in shown.out
    as_json = json.loads(world.cli("get", "job=failing", "-o", "json").out)
    Draft202012Validator(json.loads((SCHEMAS / "get.schema.json").read_text())).validate(as_json)
    assert as_json["gave_up"]["output_tail"] == tail
