"""Worker environments: the CUDA_VISIBLE_DEVICES rules, table-driven."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from allocator.errors import RequestError
from allocator.placement.worker_env import (
    MASTER_PORT_RANGE,
    default_master_port,
    render_exports,
    worker_environments,
)
from allocator.policy.model import FallbackRule, Host, Job, Policy
from allocator.records.gpu_info import GpuInfo, MigDevice
from allocator.records.types import Assignment
from allocator.worker import parse_visible_devices

UUID = "GPU-6f1c2a53-0000-4000-8000-00000000000{}".format


def gpu(index: int, **fields: Any) -> GpuInfo:
    return GpuInfo(index=index, uuid=UUID(index), **fields)


INVENTORY = [gpu(i) for i in range(4)]
MIG_GPU = GpuInfo(
    index=2,
    uuid=UUID(2),
    mig_enabled=True,
    mig_devices=(MigDevice("MIG-1111"), MigDevice("MIG-2222")),
)


def policy(workers: str = "single", threads: int | None = 8, **kwargs: Any) -> Policy:
    return Policy(
        version=1,
        hosts={"node1": Host("node1", 4)},
        jobs={"train": Job("train", ("python", "train.py"), workers=workers, fallback="cpu")},  # type: ignore[arg-type]
        fallback={"cpu": FallbackRule("cpu", "cpu", threads=threads)},
        **kwargs,
    )


def assign(gpus: tuple[int, ...], mode: str = "gpu", **kwargs: Any) -> Assignment:
    return Assignment(
        job="train",
        host="node1",
        gpus=gpus,
        mode=mode,  # type: ignore[arg-type]
        updated_by="ops",
        updated_at="2026-01-01T00:00:00Z",
        **kwargs,
    )


def visible(envs: list[dict[str, str]]) -> list[str]:
    return [env["CUDA_VISIBLE_DEVICES"] for env in envs]


@pytest.mark.parametrize(
    ("gpus", "inventory", "pol", "expected"),
    [
        # UUIDs by default, in the assignment's order (not sorted)
        ((2, 1), INVENTORY, policy(), f"{UUID(2)},{UUID(1)}"),
        ((3,), INVENTORY, policy(), UUID(3)),
        # index mode, or an unknown inventory: indices, still in order
        ((2, 1), INVENTORY, policy(visible_devices="index"), "2,1"),
        ((2, 0), None, policy(), "2,0"),
        # one GPU without a known UUID: indices for all, never mixed
        ((0, 1), [gpu(0), GpuInfo(index=1)], policy(), "0,1"),
        # a declared-only inventory (indices only)
        ((1,), [GpuInfo(index=i) for i in range(2)], policy(), "1"),
    ],
)
def test_visible_devices_form_and_order(
    gpus: tuple[int, ...], inventory: list[GpuInfo] | None, pol: Policy, expected: str
) -> None:
    (env,) = worker_environments(assign(gpus), inventory, pol)
    assert env["CUDA_VISIBLE_DEVICES"] == expected
    assert env["NVIDIA_VISIBLE_DEVICES"] == expected
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["ALLOCATOR_GPUS"] == ",".join(str(g) for g in gpus)
    assert env["ALLOCATOR_DEVICE"] == "cuda"
    assert (env["ALLOCATOR_JOB"], env["ALLOCATOR_HOST"]) == ("train", "node1")
    assert " " not in expected
    # CUDA parses it back to exactly these devices, in this order
    assert parse_visible_devices(expected).entries == tuple(expected.split(","))


def test_single_worker_env_has_no_rank_variables() -> None:
    (env,) = worker_environments(assign((0, 1)), INVENTORY, policy())
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"} & env.keys()
    assert "ALLOCATOR_FALLBACK_REASON" not in env


def test_per_gpu_workers_each_see_only_their_gpu_with_torchrun_ranks() -> None:
    envs = worker_environments(
        assign((3, 1, 2)), INVENTORY, policy("per-gpu"), master_addr="10.0.0.7", master_port=29400
    )
    assert visible(envs) == [UUID(3), UUID(1), UUID(2)]
    assert [e["ALLOCATOR_GPUS"] for e in envs] == ["3", "1", "2"]
    for rank, env in enumerate(envs):
        assert env["LOCAL_RANK"] == env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.7", "29400")


def test_per_gpu_master_port_is_derived_from_the_job_name() -> None:
    envs = worker_environments(assign((0, 1)), INVENTORY, policy("per-gpu"))
    ports = {int(env["MASTER_PORT"]) for env in envs}
    assert ports == {default_master_port("train")}
    low, high = MASTER_PORT_RANGE
    assert all(low <= port < high and port > 1024 for port in ports)
    assert default_master_port("train") == default_master_port("train")
    assert len({default_master_port(f"job{i}") for i in range(50)}) > 40


@pytest.mark.parametrize(
    ("gpus", "reason", "env_reason"),
    [
        ((), None, "assigned to CPU"),
        ((), "no GPU free", "no GPU free"),
    ],
)
def test_cpu_assignment(gpus: tuple[int, ...], reason: str | None, env_reason: str) -> None:
    (env,) = worker_environments(assign(gpus, mode="cpu", fallback_reason=reason), None, policy())
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # empty, not unset, not -1
    assert parse_visible_devices(env["CUDA_VISIBLE_DEVICES"]).kind == "none"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["ALLOCATOR_DEVICE"] == "cpu"
    assert env["ALLOCATOR_GPUS"] == ""
    assert env["ALLOCATOR_FALLBACK_REASON"] == env_reason
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "8"


def test_fallback_reason_turns_a_gpu_assignment_into_cpu() -> None:
    (env,) = worker_environments(
        assign((0, 1)), INVENTORY, policy(), fallback_reason="GPU 1 unhealthy: XID 79"
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ALLOCATOR_DEVICE"] == "cpu"
    assert env["ALLOCATOR_FALLBACK_REASON"] == "GPU 1 unhealthy: XID 79"


def test_cpu_without_thread_count_sets_no_thread_variables() -> None:
    (env,) = worker_environments(assign((), mode="cpu"), None, policy(threads=None))
    assert "OMP_NUM_THREADS" not in env and "MKL_NUM_THREADS" not in env


def test_per_gpu_job_on_cpu_runs_one_worker_of_one() -> None:
    envs = worker_environments(assign((0, 1, 2), mode="cpu"), INVENTORY, policy("per-gpu"))
    assert len(envs) == 1
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == ""
    assert (envs[0]["RANK"], envs[0]["WORLD_SIZE"]) == ("0", "1")


@pytest.mark.parametrize("mode", ["uuid", "index"])
def test_mig_gpu_gives_its_first_mig_instance(mode: str) -> None:
    inventory = [gpu(0), gpu(1), MIG_GPU]
    (env,) = worker_environments(assign((2,)), inventory, policy(visible_devices=mode))
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "MIG-1111"
    assert env["ALLOCATOR_GPUS"] == "2"


def test_per_gpu_workers_each_get_one_mig_or_gpu_uuid() -> None:
    envs = worker_environments(assign((2, 0)), [gpu(0), gpu(1), MIG_GPU], policy("per-gpu"))
    assert visible(envs) == ["MIG-1111", UUID(0)]


@pytest.mark.parametrize(
    ("gpus", "inventory", "message"),
    [
        ((2, 0), [gpu(0), gpu(1), MIG_GPU], "only one MIG device"),
        ((0, 0), INVENTORY, "listed twice"),
        ((-1,), INVENTORY, "negative"),
        ((), INVENTORY, "no GPUs"),
        ((7,), INVENTORY, "GPU 7 not on this host"),
        ((2,), [GpuInfo(index=2, mig_enabled=True)], "no MIG instance"),
        ((0,), [GpuInfo(index=0, uuid="GPU-a b")], "unusable device id"),
        ((0,), [GpuInfo(index=0, uuid="GPU-a,GPU-b")], "unusable device id"),
        ((0, 1), [GpuInfo(index=0, uuid="GPU-a"), GpuInfo(index=1, uuid="GPU-a")], "repeated"),
    ],
)
def test_impossible_assignments_are_request_errors(
    gpus: tuple[int, ...], inventory: list[GpuInfo], message: str
) -> None:
    with pytest.raises(RequestError, match=message):
        worker_environments(assign(gpus), inventory, policy())


def test_bad_master_port_is_a_request_error() -> None:
    with pytest.raises(RequestError, match="MASTER_PORT"):
        worker_environments(assign((0,)), INVENTORY, policy("per-gpu"), master_port=70000)


def test_job_missing_from_policy_gets_a_single_worker() -> None:
    other = Assignment("adhoc", "node1", (0, 1), "gpu", "ops", "t")
    assert len(worker_environments(other, INVENTORY, policy("per-gpu"))) == 1


def test_exports_survive_eval_in_a_real_shell() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "",
        "ALLOCATOR_FALLBACK_REASON": 'it\'s "odd" $HOME `x` \\ ;\nsecond line',
        "ALLOCATOR_JOB": "train",
    }
    exports = render_exports(env)
    assert exports.splitlines()[0] == "export CUDA_VISIBLE_DEVICES=''"
    script = exports + 'printf "%s\\0" "${CUDA_VISIBLE_DEVICES-UNSET}" "$ALLOCATOR_FALLBACK_REASON"'
    out = subprocess.run(
        ["bash", "-c", 'eval "$(cat)"'], input=script, capture_output=True, text=True, check=True
    )
    assert out.stdout.split("\0")[:2] == ["", env["ALLOCATOR_FALLBACK_REASON"]]


def test_exports_refuse_names_a_shell_cannot_hold() -> None:
    with pytest.raises(RequestError, match="not a valid environment variable"):
        render_exports({"BAD-NAME": "x"})
