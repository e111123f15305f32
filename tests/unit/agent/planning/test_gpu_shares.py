"""What the agent gives workers on shared GPUs (their share, MPS) and which CPUs it pins them to."""

from __future__ import annotations

from collections.abc import Sequence

from allocator.agent.gpu_care.mps import mps_clients
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import DesiredJob
from allocator.policy.model import FallbackRule, Host, Job, Policy, Pool, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

HOST = "node1"
INVENTORY = tuple(
    GpuInfo(
        index=i,
        uuid=f"GPU-{i:04d}",
        memory_total_mib=81920,
        numa_node=i // 2,
        cpu_affinity="0-3" if i < 2 else "4-7",
    )
    for i in range(4)
)
ALL_CPUS = frozenset(range(8))


def make_policy(sharing: Sharing, *jobs: Job, threads: int | None = None) -> Policy:
    chosen = jobs or (Job("serve", ("serve",)), Job("ranks", ("train",), workers="per-gpu"))
    return Policy(
        version=1,
        hosts={HOST: Host(HOST, 4, pool="p")},
        pools={"p": Pool("p", (HOST,), sharing=sharing)},
        jobs={job.name: job for job in chosen},
        fallback={"cpu": FallbackRule("cpu", "cpu", threads=threads)} if threads else {},
    )


def assigned(
    job: str, *gpus: int, slots: int = 1, exclusive: bool = False, mode: str = "gpu"
) -> Assignment:
    return Assignment(
        job=job,
        host=HOST,
        gpus=gpus,
        mode="gpu" if mode == "gpu" else "cpu",
        updated_by="ops",
        updated_at="2026-01-01T00:00:00Z",
        slots=slots,
        exclusive=exclusive,
    )


def decide(
    policy: Policy,
    *assignments: Assignment,
    allowed: frozenset[int] = ALL_CPUS,
    inventory: Sequence[GpuInfo] | None = INVENTORY,
) -> dict[str, DesiredJob]:
    return desired_jobs(
        DesiredInputs(
            policy,
            HOST,
            {a.job: a for a in assignments},
            {a.job: 3 for a in assignments},
            inventory,
            {},
            {},
            allowed_cpus=allowed,
            mps_dir="/state/mps",
        )
    )


# --- shares -----------------------------------------------------------------------------


def test_a_time_sliced_worker_is_told_its_share_of_the_memory() -> None:
    want = decide(make_policy(Sharing("time-slice", 4)), assigned("serve", 1, slots=3))["serve"]
    (worker,) = want.workers
    assert worker.env["ALLOCATOR_GPU_MEMORY_FRACTION"] == "0.75"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in worker.env
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "GPU-0001"


def test_an_mps_worker_gets_its_gpus_daemon_and_its_share_of_sms_and_memory() -> None:
    want = decide(make_policy(Sharing("mps", 4)), assigned("ranks", 2, 3))["ranks"]
    first, second = want.workers
    assert first.env["CUDA_MPS_PIPE_DIRECTORY"] == "/state/mps/gpu2/pipe"
    assert second.env["CUDA_MPS_PIPE_DIRECTORY"] == "/state/mps/gpu3/pipe"
    assert first.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert first.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert first.env["ALLOCATOR_GPU_MEMORY_FRACTION"] == "0.25"
    # the daemon has only its GPU visible, by UUID: the client names it the same way
    assert (first.env["CUDA_VISIBLE_DEVICES"], second.env["CUDA_VISIBLE_DEVICES"]) == (
        "GPU-0002",
        "GPU-0003",
    )
    assert mps_clients({"ranks": want}) == {"ranks": frozenset({2, 3})}


def test_an_mps_client_without_a_known_uuid_sees_its_gpu_as_device_0() -> None:
    bare = tuple(GpuInfo(index=i) for i in range(4))
    want = decide(make_policy(Sharing("mps", 2)), assigned("serve", 3), inventory=bare)["serve"]
    (worker,) = want.workers
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert worker.env["ALLOCATOR_GPUS"] == "3"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in worker.env  # no memory size known


def test_a_job_holding_gpus_whole_or_in_an_unlimited_pool_is_told_no_share() -> None:
    solo = decide(make_policy(Sharing("mps", 4)), assigned("serve", 1, exclusive=True))["serve"]
    assert not any(k.startswith(("CUDA_MPS_", "ALLOCATOR_GPU_MEMORY")) for k in solo.workers[0].env)
    assert mps_clients({"serve": solo}) == {}
    unlimited = decide(make_policy(Sharing("time-slice", None)), assigned("serve", 1))["serve"]
    assert "ALLOCATOR_GPU_MEMORY_FRACTION" not in unlimited.workers[0].env


def test_a_single_worker_on_two_mps_gpus_is_refused_with_the_reason() -> None:
    want = decide(make_policy(Sharing("mps", 2)), assigned("serve", 0, 1))["serve"]
    assert want.state == "refused"
    assert "under MPS a worker uses one GPU" in want.message


def test_shared_gpus_are_not_refused_as_double_claims() -> None:
    result = decide(
        make_policy(Sharing("time-slice", 2)), assigned("serve", 0), assigned("ranks", 0)
    )
    assert {want.state for want in result.values()} == {"run"}


# --- CPU affinity -------------------------------------------------------------------------


def test_each_worker_is_pinned_to_its_own_gpus_cpus_and_numa_node() -> None:
    want = decide(make_policy(Sharing()), assigned("ranks", 1, 2))["ranks"]
    assert [(w.gpus, w.cpus, w.mems) for w in want.workers] == [
        ((1,), (0, 1, 2, 3), (0,)),
        ((2,), (4, 5, 6, 7), (1,)),
    ]
    both = decide(make_policy(Sharing()), assigned("serve", 1, 2))["serve"]
    assert (both.workers[0].cpus, both.workers[0].mems) == (tuple(range(8)), (0, 1))


def test_pinning_stays_within_the_agents_own_cpus_and_is_not_fingerprinted() -> None:
    policy = make_policy(Sharing())
    narrow = decide(policy, assigned("serve", 2), allowed=frozenset({5, 9}))["serve"]
    wide = decide(policy, assigned("serve", 2))["serve"]
    assert narrow.workers[0].cpus == (5,)
    assert narrow.fingerprint == wide.fingerprint == fingerprint(wide.workers)
    outside = decide(policy, assigned("serve", 2), allowed=frozenset({0}))["serve"]
    assert outside.workers[0].cpus == ()  # none of its CPUs may be used: left unpinned


def test_cpu_affinity_none_and_gpus_without_affinity_leave_workers_unpinned() -> None:
    free = make_policy(Sharing(), Job("serve", ("serve",), cpu_affinity="none"))
    assert decide(free, assigned("serve", 0))["serve"].workers[0].cpus == ()
    unknown = tuple(GpuInfo(index=i) for i in range(4))
    plain = make_policy(Sharing())
    assert decide(plain, assigned("serve", 0), inventory=unknown)["serve"].workers[0].cpus == ()


def test_cpu_fallback_workers_get_their_rules_threads_laid_out_side_by_side() -> None:
    jobs = (Job("a", ("a",), fallback="cpu"), Job("b", ("b",), fallback="cpu"))
    policy = make_policy(Sharing(), *jobs, threads=3)
    result = decide(policy, assigned("a", mode="cpu"), assigned("b", mode="cpu"))
    assert result["a"].workers[0].cpus == (0, 1, 2)
    assert result["b"].workers[0].cpus == (3, 4, 5)
    assert result["a"].workers[0].mems == ()
    crowded = decide(
        policy,
        assigned("a", mode="cpu"),
        assigned("b", mode="cpu"),
        allowed=frozenset({0, 1, 2, 3}),
    )
    assert crowded["b"].workers[0].cpus == (0, 1, 3)  # wraps round when CPUs run out
