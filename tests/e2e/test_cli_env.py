"""`allocator env` and `allocator doctor` as an operator runs them, on a fake-NVML host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import EXAMPLE_POLICY, Result, run_cli
from tests.support.fake_gpus import write_fake_nvml


@pytest.fixture
def env_for(tmp_path: Path) -> dict[str, str]:
    """SQLite store with the example policy applied, NVML faked with 4 GPUs."""
    gpus = write_fake_nvml(tmp_path / "gpus.json", 4, driver_version="550.54.15")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCATOR_", "CUDA_"))}
    env.update(ALLOCATOR_STORE=f"sqlite://{tmp_path / 's.db'}", ALLOCATOR_NVML=f"fake:{gpus}")
    assert run_cli(["policy", "apply", str(EXAMPLE_POLICY)], env).code == 0
    return env


def _cli(env: dict[str, str], *args: str) -> Result:
    result = run_cli(args, env)
    assert result.code == 0, result.err
    return result


def test_eval_of_env_gives_the_workers_variables(env_for: dict[str, str]) -> None:
    _cli(env_for, "set", "job=train", "gpus=2,1", "host=node1")
    script = (
        'eval "$(allocator env job=train)"; '
        'echo "$CUDA_VISIBLE_DEVICES|$ALLOCATOR_GPUS|$CUDA_DEVICE_ORDER"'
    )
    bindir = str(Path(sys.executable).parent)
    out = subprocess.run(
        ["bash", "-c", script],
        env={**env_for, "PATH": f"{bindir}:{env_for['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    visible, physical, order = out.split("|")
    assert visible.split(",") == [
        "GPU-00000000-0000-4000-8000-000000000002",
        "GPU-00000000-0000-4000-8000-000000000001",
    ]
    assert physical == "2,1" and order == "PCI_BUS_ID"


def test_per_gpu_job_has_one_environment_per_gpu_with_ranks(env_for: dict[str, str]) -> None:
    _cli(env_for, "set", "job=eval-nightly", "gpus=3,0", "host=node1")
    envs = json.loads(_cli(env_for, "env", "job=eval-nightly", "-o", "json").out)
    assert [e["ALLOCATOR_GPUS"] for e in envs] == ["3", "0"]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    second = _cli(env_for, "env", "job=eval-nightly", "worker=1")
    assert "export LOCAL_RANK=1" in second.out and "2 workers" in second.err


def test_cpu_assignment_sets_an_empty_device_list(env_for: dict[str, str]) -> None:
    _cli(env_for, "set", "job=train", "gpus=cpu", "host=node1")
    (env,) = json.loads(_cli(env_for, "env", "job=train", "-o", "json").out)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ALLOCATOR_DEVICE"] == "cpu"
    assert env["OMP_NUM_THREADS"] == "8"  # the job's cpu-8 fallback rule


def test_env_of_a_job_holding_nothing_is_not_found(env_for: dict[str, str]) -> None:
    result = run_cli(["env", "job=train", "host=node1"], env_for)
    assert result.code == 6 and "holds nothing" in result.err


def test_doctor_reports_each_finding_and_fails_without_an_agent(env_for: dict[str, str]) -> None:
    result = run_cli(
        ["doctor", "host=node1", "--no-torch", "-o", "json"],
        {**env_for, "CUDA_VISIBLE_DEVICES": "0"},
    )
    report = json.loads(result.out)
    status = {f["check"]: f["status"] for f in report["findings"]}
    assert status["nvml"] == "ok" and status["gpus"] == "ok" and status["store"] == "ok"
    assert status["environment"] == "warn"  # CUDA_VISIBLE_DEVICES set where the agent runs
    assert status["agent"] == "fail" and result.code == 3


def test_env_shows_the_container_command_its_agent_would_run(tmp_path: Path) -> None:
    gpus = write_fake_nvml(tmp_path / "gpus.json", 4)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCATOR_", "CUDA_"))}
    env.update(ALLOCATOR_STORE=f"sqlite://{tmp_path / 's.db'}", ALLOCATOR_NVML=f"fake:{gpus}")
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\n"
        "hosts: {node1: {gpus: 4}}\n"
        "jobs:\n"
        "  boxed: {command: [train], container: {image: 'train:1', mounts: ['/d:/d:ro']}}\n"
        "  docked: {command: [train], container: {image: 'train:1', engine: docker}}\n"
    )
    _cli(env, "policy", "apply", str(policy))
    _cli(env, "set", "job=boxed", "gpus=2", "host=node1")
    _cli(env, "set", "job=docked", "gpus=0,1", "host=node1")
    boxed = _cli(env, "env", "job=boxed").out.splitlines()
    assert boxed[-1].startswith("# container: podman run --rm --name allocator-boxed.0.")
    assert "--device nvidia.com/gpu=GPU-00000000-0000-4000-8000-000000000002 " in boxed[-1]
    assert "--env CUDA_VISIBLE_DEVICES " in boxed[-1] and "--volume /d:/d:ro" in boxed[-1]
    assert boxed[-1].endswith(" train:1 train")
    # Docker has no CDI here: one --gpus option, its value quoted for docker's CSV reader.
    docked = _cli(env, "env", "job=docked").out.splitlines()[-1]
    uuids = ",".join(f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in (0, 1))
    assert f"--gpus '\"device={uuids}\"' " in docked and "--device" not in docked
    assert docked.startswith("# container: docker run --rm")
