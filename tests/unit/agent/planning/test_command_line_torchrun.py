"""``workers: torchrun``, ``$(VAR)`` in commands and ``ALLOCATOR_GPU_COUNT`` (pure)."""

from __future__ import annotations

import pytest

from allocator.agent.planning.command_line import expand_references
from allocator.agent.planning.desired import desired_job
from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import WorkerSpec
from allocator.placement.worker_env import NodeGroup, default_master_port
from allocator.policy.model import FallbackRule, Job, Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

INVENTORY = tuple(GpuInfo(index=i, uuid=f"GPU-{i:04d}") for i in range(4))
ENV = {"ALLOCATOR_GPU_COUNT": "2", "ALLOCATOR_JOB": "ddp", "EMPTY": ""}


@pytest.mark.parametrize(
    ("written", "expanded"),
    [
        ("--nproc=$(ALLOCATOR_GPU_COUNT)", "--nproc=2"),
        ("$(ALLOCATOR_JOB)-$(ALLOCATOR_GPU_COUNT)", "ddp-2"),
        ("$(EMPTY)x", "x"),
        ("$$(ALLOCATOR_JOB)", "$(ALLOCATOR_JOB)"),  # escaped
        ("$$$(ALLOCATOR_JOB)", "$ddp"),
        ("cost: 5$$", "cost: 5$"),
        ("$(NOPE) stays", "$(NOPE) stays"),  # unknown: left as written, like Kubernetes
        ("$ALLOCATOR_JOB", "$ALLOCATOR_JOB"),  # no shell: $VAR is text
        ("$(ALLOCATOR_JOB", "$(ALLOCATOR_JOB"),  # unclosed
        ("trailing $", "trailing $"),
        ("$()", "$()"),
    ],
)
def test_references_expand_as_kubernetes_does(written: str, expanded: str) -> None:
    assert expand_references(written, ENV) == expanded


def _job(**fields: object) -> Job:
    base = {"name": "ddp", "command": ("train.py", "--gpus=$(ALLOCATOR_GPU_COUNT)")}
    return Job(**{**base, **fields})  # type: ignore[arg-type]


def _assigned(gpus: tuple[int, ...] = (2, 3), mode: str = "gpu", **fields: object) -> Assignment:
    return Assignment(
        job="ddp",
        host="node1",
        gpus=gpus if mode == "gpu" else (),
        mode=mode,  # type: ignore[arg-type]
        updated_by="ops",
        updated_at="2025-01-01T00:00:00Z",
        **fields,  # type: ignore[arg-type]
    )


def _policy(job: Job) -> Policy:
    return Policy(version=1, jobs={job.name: job}, fallback={"cpu": FallbackRule("cpu", "cpu")})


def test_a_torchrun_job_on_one_host_runs_torchrun_with_one_process_per_gpu() -> None:
    job = _job(workers="torchrun")
    want = desired_job(_policy(job), _assigned(), 3, INVENTORY, {}, None, master_port=29411)
    (worker,) = want.workers
    assert worker.argv == (
        "torchrun",
        "--nnodes=1",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        "--master-port=29411",
        "--nproc-per-node=2",
        "train.py",
        "--gpus=2",
    )
    assert worker.env["ALLOCATOR_GPU_COUNT"] == "2" and worker.env["MASTER_PORT"] == "29411"
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "GPU-0002,GPU-0003"


def test_on_the_cpu_fallback_torchrun_starts_one_process() -> None:
    job = _job(workers="torchrun", fallback="cpu")
    want = desired_job(_policy(job), _assigned(), 3, INVENTORY, {2: "XID 79"}, None)
    (worker,) = want.workers
    assert want.device == "cpu" and worker.env["ALLOCATOR_GPU_COUNT"] == "0"
    assert "--nproc-per-node=1" in worker.argv and worker.argv[-1] == "--gpus=0"
    assert f"--master-port={default_master_port('ddp')}" in worker.argv


def test_a_share_across_hosts_meets_at_the_jobs_rendezvous() -> None:
    from allocator.agent.planning.across_hosts import Share

    job = _job(workers="torchrun")
    group = NodeGroup(node_rank=1, nnodes=2, master_addr="10.0.0.1", master_port=27075)
    share = Share(group=group)
    want = desired_job(_policy(job), _assigned(), 3, INVENTORY, {}, None, share=share)
    assert want.workers[0].argv[:6] == (
        "torchrun",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=27075",
        "--nproc-per-node=2",
    )


def test_every_mode_gives_every_worker_its_gpu_count_and_expands_the_command() -> None:
    single = desired_job(_policy(_job()), _assigned(), 3, INVENTORY, {}, None)
    assert [w.argv for w in single.workers] == [("train.py", "--gpus=2")]
    per_gpu = desired_job(_policy(_job(workers="per-gpu")), _assigned(), 3, INVENTORY, {}, None)
    assert [w.env["ALLOCATOR_GPU_COUNT"] for w in per_gpu.workers] == ["1", "1"]
    assert [w.argv[-1] for w in per_gpu.workers] == ["--gpus=1", "--gpus=1"]


def test_the_gpu_count_does_not_change_a_workers_fingerprint() -> None:
    """Workers started before the variable existed are not restarted by an upgrade."""
    spec = WorkerSpec("ddp", 0, ("x",), {"ALLOCATOR_GPUS": "2,3"}, None, (2, 3), "cuda")
    counted = WorkerSpec(
        "ddp",
        0,
        ("x",),
        {"ALLOCATOR_GPUS": "2,3", "ALLOCATOR_GPU_COUNT": "2"},
        None,
        (2, 3),
        "cuda",
    )
    assert fingerprint([spec]) == fingerprint([counted])


def test_under_mps_a_torchrun_job_on_several_gpus_is_refused_like_a_single_worker() -> None:
    from allocator.policy.model import Pool, Sharing

    job = _job(workers="torchrun")
    pool = Pool(name="p", hosts=("node1",), sharing=Sharing("mps", 2))
    pol = Policy(version=1, jobs={"ddp": job}, pools={"p": pool})
    want = desired_job(pol, _assigned(), 3, INVENTORY, {}, None)
    assert want.state == "refused" and "under MPS a worker uses one GPU" in want.message
