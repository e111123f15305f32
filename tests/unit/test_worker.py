"""What a worker reads from its environment, and CUDA_VISIBLE_DEVICES parsing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from allocator.errors import InvalidInput
from allocator.placement.worker_env import worker_environments
from allocator.policy.model import FallbackRule, Job, Policy
from allocator.records.types import Assignment
from allocator.worker import (
    current,
    device_kind,
    fallback_reason,
    gpu_assigned,
    local_rank,
    parse_visible_devices,
    rank,
    threads,
    world_size,
)

G0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
G1 = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
MIG = "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0"


@pytest.mark.parametrize(
    ("value", "kind", "entries"),
    [
        # unset = every device; empty and the usual "none" spellings = no device
        (None, "all", ()),
        ("", "none", ()),
        ("-1", "none", ()),
        ("NoDevFiles", "none", ()),
        # indices, enumerated in the listed order
        ("0", "index", ("0",)),
        ("2,1", "index", ("2", "1")),
        # parsing stops at the first invalid entry (CUDA programming guide's example)
        ("0,2,-1,1", "index", ("0", "2")),
        ("0,,1", "index", ("0",)),
        ("0,1,", "index", ("0", "1")),
        ("1,GPU-abc", "index", ("1",)),
        ("x,1", "none", ()),
        # index entries are read like strtoul: leading space skipped, trailing junk ignored
        ("0, 1", "index", ("0", "1")),
        (" 3 ,1gpu", "index", ("3", "1")),
        ("+2", "index", ("2",)),
        # a repeated device makes CUDA see none at all
        ("0,1,0", "none", ()),
        ("1, 01", "none", ()),
        # UUIDs (full or unique prefixes), compared verbatim
        (f"{G0},{G1}", "uuid", (G0, G1)),
        ("GPU-8932f937", "uuid", ("GPU-8932f937",)),
        (f"{G0}, {G1}", "uuid", (G0,)),
        (f"{G0},0", "uuid", (G0,)),
        (f"{G0},{G0}", "none", ()),
        (f" {G0}", "none", ()),
        # MIG forms
        ("MIG-1111", "mig", ("MIG-1111",)),
        (MIG, "mig", (MIG,)),
        (f"MIG-1111,{G0}", "mig", ("MIG-1111",)),
    ],
)
def test_parse_visible_devices_like_cuda(
    value: str | None, kind: str, entries: tuple[str, ...]
) -> None:
    parsed = parse_visible_devices(value)
    assert (parsed.kind, parsed.entries) == (kind, entries)
    assert parsed.raw == value
    assert parsed.count == (None if kind == "all" else len(entries))


def test_parse_explains_why_it_stopped_or_saw_none() -> None:
    assert "invalid entry 2" in parse_visible_devices("0,2,-1,1").note
    assert "duplicate" in parse_visible_devices("0,0").note
    assert parse_visible_devices(None).note.startswith("unset")
    assert parse_visible_devices("2,1").indices == (2, 1)
    assert parse_visible_devices(G0).indices == ()


def environ_for(
    gpus: tuple[int, ...], mode: str = "gpu", workers: str = "single"
) -> list[dict[str, str]]:
    policy = Policy(
        version=1,
        jobs={"train": Job("train", ("x",), workers=workers, fallback="cpu")},  # type: ignore[arg-type]
        fallback={"cpu": FallbackRule("cpu", "cpu", threads=4)},
        visible_devices="index",
    )
    assignment = Assignment("train", "node1", gpus, mode, "ops", "t")  # type: ignore[arg-type]
    return worker_environments(assignment, None, policy)


def test_current_reads_back_what_the_agent_sets_for_a_gpu_worker() -> None:
    (env,) = environ_for((3, 1))
    worker = current(env)
    assert (worker.job, worker.host, worker.device) == ("train", "node1", "cuda")
    assert worker.gpus == (3, 1)
    assert worker.visible.indices == (3, 1)
    assert (worker.local_rank, worker.rank, worker.world_size) == (0, 0, 1)
    assert worker.fallback_reason is None and worker.threads is None


def test_current_reads_back_per_gpu_ranks() -> None:
    envs = environ_for((0, 1, 2), workers="per-gpu")
    workers = [current(env) for env in envs]
    assert [(w.local_rank, w.rank, w.world_size, w.local_world_size) for w in workers] == [
        (0, 0, 3, 3),
        (1, 1, 3, 3),
        (2, 2, 3, 3),
    ]
    assert [w.visible.entries for w in workers] == [("0",), ("1",), ("2",)]


def test_current_reads_back_a_cpu_fallback() -> None:
    (env,) = environ_for((), mode="cpu")
    worker = current(env)
    assert worker.device == "cpu"
    assert worker.visible.kind == "none" and worker.gpus == ()
    assert worker.fallback_reason == "assigned to CPU"
    assert worker.threads == 4


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "cuda"),  # nothing said: all devices visible
        ({"CUDA_VISIBLE_DEVICES": ""}, "cpu"),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, "cpu"),
        ({"ALLOCATOR_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "0"}, "cpu"),
        ({"ALLOCATOR_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""}, "cpu"),
        ({"ALLOCATOR_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": G0}, "cuda"),
    ],
)
def test_device_kind(env: dict[str, str], expected: str) -> None:
    assert device_kind(env) == expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),  # nothing assigned: a script run by hand
        ({"ALLOCATOR_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": G0}, True),
        ({"ALLOCATOR_DEVICE": "cuda"}, True),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, True),  # another scheduler's assignment
        ({"CUDA_VISIBLE_DEVICES": MIG}, True),
        ({"CUDA_VISIBLE_DEVICES": ""}, False),
        ({"ALLOCATOR_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "0"}, False),
        ({"ALLOCATOR_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""}, False),
    ],
)
def test_gpu_assigned(env: dict[str, str], expected: bool) -> None:
    assert gpu_assigned(env) is expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"OMP_NUM_THREADS": "6"}, 6),
        ({"ALLOCATOR_THREADS": "3", "OMP_NUM_THREADS": "6"}, 3),
        ({"ALLOCATOR_THREADS": " "}, None),
    ],
)
def test_threads(env: dict[str, str], expected: int | None) -> None:
    assert threads(env) == expected


def test_rank_readers_default_to_a_single_worker() -> None:
    assert (local_rank({}), rank({}), world_size({})) == (0, 0, 1)
    assert rank({"LOCAL_RANK": "2"}) == 2
    assert fallback_reason({"ALLOCATOR_FALLBACK_REASON": ""}) is None


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"LOCAL_RANK": "one"}, "LOCAL_RANK"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "-1"}, "RANK"),
        ({"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS"),
        ({"ALLOCATOR_DEVICE": "gpu"}, "ALLOCATOR_DEVICE"),
        ({"ALLOCATOR_GPUS": "0,x"}, "ALLOCATOR_GPUS"),
    ],
)
def test_bad_values_are_one_clear_error(env: dict[str, str], name: str) -> None:
    with pytest.raises(InvalidInput, match=name):
        current(env)


def test_worker_module_imports_no_torch() -> None:
    code = "import sys, allocator.worker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
