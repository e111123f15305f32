"""``allocator env`` in-process: the environment a job's worker starts with."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from allocator.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"


@pytest.fixture
def store() -> str:
    url = f"memory://env-{uuid.uuid4().hex}"
    assert main(["policy", "apply", str(EXAMPLE), "--store", url]) == 0
    return url


def _env(store: str, *words: str, capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    capsys.readouterr()
    assert main(["env", *words, "--store", store, "-o", "json"]) == 0
    envs: list[dict[str, str]] = json.loads(capsys.readouterr().out)
    return envs


def test_an_undeclared_job_across_hosts_gets_its_rendezvous_on_every_host(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not in the policy, so no agent runs it: whoever runs it by hand needs the same variables.
    assert main(["set", "job=mh", "count=1", "host=node1,node2", "--store", store]) == 0
    first = _env(store, "job=mh", "host=node1", capsys=capsys)
    second = _env(store, "job=mh", "host=node2", capsys=capsys)
    assert [w["ALLOCATOR_NODE_RANK"] for w in first + second] == ["0", "1"]
    assert {w["ALLOCATOR_NNODES"] for w in first + second} == {"2"}
    assert {w["MASTER_ADDR"] for w in first + second} == {"node1"}  # no agent has an address
    ports = {w["MASTER_PORT"] for w in first + second}
    assert len(ports) == 1 and ports.pop().isdigit()


def test_an_undeclared_job_on_one_host_gets_no_rendezvous(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["set", "job=solo", "count=1", "host=node1", "--store", store]) == 0
    (env,) = _env(store, "job=solo", "host=node1", capsys=capsys)
    assert "MASTER_ADDR" not in env and "ALLOCATOR_NODE_RANK" not in env
    assert env["CUDA_VISIBLE_DEVICES"] != ""
