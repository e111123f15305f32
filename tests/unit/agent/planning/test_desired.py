"""desired_jobs: policy + assignments + GPU health -> what the agent wants to run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import pytest

from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.fingerprint import fingerprint
from allocator.agent.planning.types import DesiredJob, Pin, WorkerSpec
from allocator.policy.model import FallbackRule, Host, Job, Policy, Pool
from allocator.policy.sharing_field import SHARED
from allocator.records.gpu_info import GpuInfo, MigDevice
from allocator.records.types import Assignment

HOST = "node7"
INVENTORY = tuple(GpuInfo(index=i, uuid=f"GPU-{i:04d}") for i in range(4))

TRAIN = Job(
    name="train",
    command=("python", "train.py"),
    env={"DATA": "/data", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    cwd="/srv/train",
    on_change="signal:SIGHUP",
    grace_seconds=30.0,
    max_restarts=7,
    restart_backoff_seconds=2.0,
    restart_backoff_max_seconds=90.0,
)


def policy(*jobs: Job, rules: Sequence[FallbackRule] = ()) -> Policy:
    """A policy holding ``jobs`` (TRAIN when none) and fallback ``rules``."""
    chosen = jobs or (TRAIN,)
    return Policy(
        version=1,
        jobs={job.name: job for job in chosen},
        fallback={rule.name: rule for rule in rules},
    )


def assigned(
    job: str = "train",
    gpus: tuple[int, ...] = (2, 1),
    mode: Literal["gpu", "cpu"] = "gpu",
    *,
    host: str = HOST,
    command: tuple[str, ...] | None = None,
    fallback_reason: str | None = None,
) -> Assignment:
    """An assignment of ``job`` (on HOST unless told)."""
    return Assignment(
        job=job,
        host=host,
        gpus=gpus if mode == "gpu" else (),
        mode=mode,
        updated_by="ops",
        updated_at="2025-01-01T00:00:00Z",
        command=command,
        fallback_reason=fallback_reason,
    )


def decide(
    pol: Policy,
    *assignments: Assignment,
    revisions: Mapping[str, int] | None = None,
    inventory: Sequence[GpuInfo] | None = INVENTORY,
    unhealthy: Mapping[int, str] | None = None,
    failed: Mapping[str, int] | None = None,
) -> dict[str, DesiredJob]:
    """desired_jobs over ``assignments`` with revision 5 for each unless told."""
    return desired_jobs(
        DesiredInputs(
            pol,
            HOST,
            {a.job: a for a in assignments},
            revisions if revisions is not None else {a.job: 5 for a in assignments},
            inventory,
            unhealthy or {},
            failed or {},
        )
    )


def one(
    pol: Policy,
    assignment: Assignment,
    *,
    revisions: Mapping[str, int] | None = None,
    inventory: Sequence[GpuInfo] | None = INVENTORY,
    unhealthy: Mapping[int, str] | None = None,
    failed: Mapping[str, int] | None = None,
) -> DesiredJob:
    """The desired job for a single assignment."""
    result = decide(
        pol,
        assignment,
        revisions=revisions,
        inventory=inventory,
        unhealthy=unhealthy,
        failed=failed,
    )
    assert list(result) == [assignment.job]
    return result[assignment.job]


# --- running normally ------------------------------------------------------------


def test_a_declared_job_runs_the_policy_command_on_its_gpus() -> None:
    want = one(policy(), assigned())
    assert want.state == "run"
    assert want.message == ""
    assert (want.gpus, want.device, want.fallback_reason) == ((2, 1), "cuda", None)
    assert want.assignment_revision == 5
    (worker,) = want.workers
    assert worker.argv == ("python", "train.py")
    assert (worker.job, worker.index, worker.cwd) == ("train", 0, "/srv/train")
    assert (worker.gpus, worker.device) == ((2, 1), "cuda")


def test_the_policy_settings_of_the_job_are_carried_over() -> None:
    want = one(policy(), assigned())
    assert want.on_change == "signal:SIGHUP"
    assert want.grace_seconds == 30.0
    assert want.max_restarts == 7
    assert (want.backoff_base, want.backoff_max) == (2.0, 90.0)


def test_worker_env_is_the_job_env_with_the_allocators_variables_on_top() -> None:
    (worker,) = one(policy(), assigned()).workers
    assert worker.env["DATA"] == "/data"
    # The policy's own CUDA_VISIBLE_DEVICES must lose: the assignment decides the GPUs.
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "GPU-0002,GPU-0001"
    assert worker.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert worker.env["ALLOCATOR_DEVICE"] == "cuda"


def test_without_an_inventory_gpus_are_named_by_index() -> None:
    (worker,) = one(policy(), assigned(), inventory=None).workers
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "2,1"


def test_per_gpu_jobs_get_one_worker_per_gpu_each_seeing_its_own() -> None:
    job = msgspec.structs.replace(TRAIN, workers="per-gpu")
    want = one(policy(job), assigned(gpus=(3, 0)))
    assert [w.index for w in want.workers] == [0, 1]
    assert [w.gpus for w in want.workers] == [(3,), (0,)]
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in want.workers] == ["GPU-0003", "GPU-0000"]
    assert [w.env["LOCAL_RANK"] for w in want.workers] == ["0", "1"]
    assert {w.env["WORLD_SIZE"] for w in want.workers} == {"2"}
    assert want.gpus == (3, 0)


def test_a_master_port_set_by_the_policy_is_the_one_workers_get() -> None:
    job = msgspec.structs.replace(TRAIN, workers="per-gpu", env={"MASTER_PORT": "29411"})
    want = one(policy(job), assigned(gpus=(0, 1)))
    assert {w.env["MASTER_PORT"] for w in want.workers} == {"29411"}


def test_a_derived_master_port_is_stable_between_calls() -> None:
    job = msgspec.structs.replace(TRAIN, workers="per-gpu")
    first = one(policy(job), assigned(gpus=(0, 1)))
    again = one(policy(job), assigned(gpus=(0, 1)))
    assert first.workers[0].env["MASTER_PORT"].isdigit()
    assert first.fingerprint == again.fingerprint


def test_every_assignment_of_this_host_gets_a_desired_job_and_others_are_left_out() -> None:
    infer = Job(name="infer", command=("serve",))
    result = decide(
        policy(TRAIN, infer),
        assigned(),
        assigned(job="infer", gpus=(0,)),
        assigned(job="eval", gpus=(3,), host="node8"),
        revisions={"train": 3, "infer": 9},
    )
    assert sorted(result) == ["infer", "train"]
    assert result["infer"].assignment_revision == 9
    assert result["train"].assignment_revision == 3


# --- refused and undeclared ---------------------------------------------------------


def test_an_undeclared_job_is_never_run() -> None:
    want = one(policy(), assigned(job="mystery"))
    assert want.state == "undeclared"
    assert want.workers == ()
    assert want.message == (
        "job 'mystery' holds GPUs but is not declared in the policy; "
        "the agent runs only declared jobs"
    )


def test_an_ad_hoc_command_is_refused_unless_the_policy_allows_it() -> None:
    want = one(policy(), assigned(command=("rm", "-rf", "/")))
    assert want.state == "refused"
    assert want.workers == ()
    assert "train" in want.message
    assert "does not allow ad-hoc commands" in want.message


def test_an_allowed_ad_hoc_command_replaces_the_policy_command() -> None:
    job = msgspec.structs.replace(TRAIN, allow_adhoc_command=True)
    want = one(policy(job), assigned(command=("python", "sweep.py", "--lr=3e-4")))
    assert want.state == "run"
    assert want.workers[0].argv == ("python", "sweep.py", "--lr=3e-4")


def test_an_empty_ad_hoc_command_is_refused() -> None:
    job = msgspec.structs.replace(TRAIN, allow_adhoc_command=True)
    want = one(policy(job), assigned(command=()))
    assert want.state == "refused"
    assert "empty" in want.message


def test_two_mig_gpus_in_one_worker_are_refused_with_the_renderers_reason() -> None:
    mig = tuple(
        GpuInfo(index=i, uuid=f"GPU-{i}", mig_enabled=True, mig_devices=(MigDevice(f"MIG-{i}"),))
        for i in range(2)
    )
    want = one(policy(), assigned(gpus=(0, 1)), inventory=mig)
    assert want.state == "refused"
    assert want.workers == ()
    assert "MIG" in want.message
    assert want.message.startswith("job train")


def test_a_gpu_the_host_does_not_have_is_refused_naming_the_job() -> None:
    want = one(policy(), assigned(gpus=(9,)))
    assert want.state == "refused"
    assert want.message.startswith("job train: ")
    assert "9" in want.message


# --- assigned to CPU -------------------------------------------------------------------


def test_a_cpu_assignment_runs_on_cpu_from_the_start() -> None:
    want = one(policy(), assigned(mode="cpu"))
    assert (want.state, want.device, want.gpus) == ("run", "cpu", ())
    assert want.fallback_reason == "assigned gpus=cpu"
    (worker,) = want.workers
    assert (worker.device, worker.gpus) == ("cpu", ())
    assert worker.env["CUDA_VISIBLE_DEVICES"] == ""
    assert worker.env["ALLOCATOR_FALLBACK_REASON"] == "assigned gpus=cpu"


def test_a_cpu_assignment_keeps_the_reason_it_was_given() -> None:
    reason = "count=2 requested, no GPU free (fallback rule cpu-small)"
    want = one(policy(), assigned(mode="cpu", fallback_reason=reason))
    assert want.fallback_reason == reason
    assert want.workers[0].env["ALLOCATOR_FALLBACK_REASON"] == reason


# --- GPU health and fallback rules ------------------------------------------------------

CPU_RULE = FallbackRule(name="to-cpu", action="cpu", threads=6)
WAIT_RULE = FallbackRule(name="hold", action="wait")
FAIL_RULE = FallbackRule(name="stop", action="fail")


def with_rule(rule: FallbackRule) -> Policy:
    """A policy whose TRAIN job uses ``rule``."""
    return policy(msgspec.structs.replace(TRAIN, fallback=rule.name), rules=(rule,))


def test_an_unhealthy_gpu_with_a_cpu_rule_moves_the_job_to_cpu() -> None:
    want = one(with_rule(CPU_RULE), assigned(), unhealthy={2: "xid 79"})
    assert (want.state, want.device, want.gpus) == ("run", "cpu", ())
    assert want.fallback_reason == "GPU 2 unhealthy: xid 79"
    assert "GPU 2 unhealthy: xid 79" in want.message
    (worker,) = want.workers
    assert worker.env["CUDA_VISIBLE_DEVICES"] == ""
    assert worker.env["ALLOCATOR_DEVICE"] == "cpu"
    assert worker.env["ALLOCATOR_FALLBACK_REASON"] == "GPU 2 unhealthy: xid 79"
    assert worker.env["OMP_NUM_THREADS"] == "6"
    assert worker.env["MKL_NUM_THREADS"] == "6"


def test_a_cpu_fallback_job_goes_back_to_its_gpus_when_they_recover() -> None:
    sick = one(with_rule(CPU_RULE), assigned(), unhealthy={1: "ECC uncorrected"})
    healthy = one(with_rule(CPU_RULE), assigned())
    assert (healthy.state, healthy.device, healthy.gpus) == ("run", "cuda", (2, 1))
    assert healthy.fallback_reason is None
    assert healthy.fingerprint != sick.fingerprint


def test_an_unhealthy_gpu_with_a_wait_rule_makes_the_job_wait_until_it_recovers() -> None:
    want = one(with_rule(WAIT_RULE), assigned(), unhealthy={1: "GPU is lost"})
    assert want.state == "wait"
    assert want.workers == ()
    assert "GPU 1" in want.message
    assert "GPU is lost" in want.message
    assert one(with_rule(WAIT_RULE), assigned()).state == "run"


def test_an_unhealthy_gpu_with_a_fail_rule_fails_the_job() -> None:
    want = one(with_rule(FAIL_RULE), assigned(), unhealthy={2: "xid 48"})
    assert want.state == "failed"
    assert want.workers == ()
    assert "GPU 2 unhealthy: xid 48" in want.message


def test_a_failed_job_stays_failed_after_recovery_until_its_assignment_changes() -> None:
    still = one(with_rule(FAIL_RULE), assigned(), revisions={"train": 5}, failed={"train": 5})
    assert still.state == "failed"
    assert still.workers == ()
    moved = one(with_rule(FAIL_RULE), assigned(), revisions={"train": 6}, failed={"train": 5})
    assert moved.state == "run"


def test_without_a_fallback_rule_the_job_keeps_its_gpus_and_says_why() -> None:
    want = one(policy(), assigned(), unhealthy={2: "row remap failure"})
    assert (want.state, want.device, want.gpus) == ("run", "cuda", (2, 1))
    assert "GPU 2 unhealthy: row remap failure" in want.message
    assert one(policy(), assigned()).fingerprint == want.fingerprint


def test_an_unhealthy_gpu_the_job_does_not_hold_changes_nothing() -> None:
    want = one(with_rule(WAIT_RULE), assigned(), unhealthy={3: "xid 79"})
    assert (want.state, want.message) == ("run", "")


# --- fingerprint -----------------------------------------------------------------------


def test_fingerprint_is_sha256_over_the_sorted_json_of_argv_env_cwd() -> None:
    worker = WorkerSpec("j", 0, ("a", "b"), {"Z": "1", "A": "2"}, "/w", (0,), "cuda")
    body = [{"argv": ["a", "b"], "cwd": "/w", "env": {"A": "2", "Z": "1"}}]
    expected = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    assert fingerprint([worker]) == expected


@pytest.mark.parametrize(
    "change",
    [
        {"command": ("python", "train.py", "--resume")},
        {"env": {"DATA": "/data2"}},
        {"cwd": "/srv/other"},
    ],
    ids=["argv", "env", "cwd"],
)
def test_fingerprint_changes_with_what_a_running_process_cannot_change(
    change: dict[str, Any],
) -> None:
    before = one(policy(), assigned()).fingerprint
    after = one(policy(msgspec.structs.replace(TRAIN, **change)), assigned()).fingerprint
    assert before != after


def test_fingerprint_changes_when_the_gpus_change() -> None:
    assert one(policy(), assigned(gpus=(2, 1))).fingerprint != (
        one(policy(), assigned(gpus=(1, 2))).fingerprint
    )


def test_fingerprint_ignores_how_changes_are_applied() -> None:
    before = one(policy(), assigned()).fingerprint
    tuned = msgspec.structs.replace(TRAIN, on_change="restart", grace_seconds=1.0, max_restarts=1)
    assert one(policy(tuned), assigned()).fingerprint == before


# --- one job per GPU on an exclusive host (a store written around `allocator set`) ----


def test_a_second_job_on_a_gpu_another_job_runs_on_is_refused_naming_the_holder() -> None:
    infer = Job(name="infer", command=("serve",))
    result = desired_jobs(
        DesiredInputs(
            policy(TRAIN, infer),
            HOST,
            {"train": assigned(gpus=(1,)), "infer": assigned(job="infer", gpus=(1, 3))},
            {"train": 9, "infer": 4},  # infer was written first, but train's workers run on GPU 1
            INVENTORY,
            {},
            {},
            holders={"train": (1,)},
        )
    )
    assert result["train"].state == "run"
    refused = result["infer"]
    assert (refused.state, refused.workers) == ("refused", ())
    assert "GPU 1 is also assigned to job 'train', which runs on it" in refused.message
    assert refused.fingerprint == fingerprint(())


def test_without_a_running_holder_the_assignment_written_first_keeps_the_gpu() -> None:
    infer = Job(name="infer", command=("serve",))
    result = decide(
        policy(TRAIN, infer),
        assigned(gpus=(2,)),
        assigned(job="infer", gpus=(2,)),
        revisions={"train": 12, "infer": 7},
    )
    assert result["infer"].state == "run"
    assert result["train"].state == "refused"
    assert "job 'infer', which was assigned it first" in result["train"].message


def test_a_shared_pool_lets_jobs_share_a_gpu() -> None:
    infer = Job(name="infer", command=("serve",))
    shared = msgspec.structs.replace(
        policy(TRAIN, infer),
        hosts={HOST: Host(name=HOST, gpus=4, pool="p")},
        pools={"p": Pool(name="p", sharing=SHARED)},
    )
    result = decide(shared, assigned(gpus=(2,)), assigned(job="infer", gpus=(2,)))
    assert {want.state for want in result.values()} == {"run"}


def test_a_job_on_cpu_claims_no_gpu() -> None:
    infer = Job(name="infer", command=("serve",))
    train = msgspec.structs.replace(TRAIN, fallback="cpu")
    result = decide(
        policy(train, infer, rules=[FallbackRule("cpu", "cpu")]),
        assigned(gpus=(2,)),
        assigned(job="infer", gpus=(2,)),
        unhealthy={2: "XID 79"},
    )
    # train (cpu rule) runs on CPU; infer (no rule) keeps its GPU: no double claim.
    assert result["train"].device == "cpu"
    assert result["infer"].state == "run"


# --- flap pins, ports, master_addr ------------------------------------------------------


def test_a_pinned_job_stays_on_cpu_with_the_same_environment_and_says_why() -> None:
    job = msgspec.structs.replace(TRAIN, fallback="cpu")
    pol = policy(job, rules=[FallbackRule("cpu", "cpu")])
    on_cpu = one(pol, assigned(gpus=(1,)), unhealthy={1: "XID 79"})
    pin = Pin({1: "XID 79"}, "GPU 1 flapped: 4 health-driven restarts")
    pinned = desired_jobs(
        DesiredInputs(
            pol, HOST, {"train": assigned(gpus=(1,))}, {}, INVENTORY, {}, {}, pinned={"train": pin}
        )
    )["train"]
    assert pinned.device == "cpu"
    assert pinned.fingerprint == on_cpu.fingerprint  # no restart when the pin takes over
    assert pinned.message.endswith("; GPU 1 flapped: 4 health-driven restarts")


def test_per_gpu_workers_get_the_agents_port_and_master_addr() -> None:
    job = msgspec.structs.replace(TRAIN, workers="per-gpu")
    result = desired_jobs(
        DesiredInputs(
            policy(job),
            HOST,
            {"train": assigned(gpus=(0, 1))},
            {},
            INVENTORY,
            {},
            {},
            ports={"train": 23456},
            master_addr="10.1.2.3",
        )
    )
    envs = [w.env for w in result["train"].workers]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.1.2.3", "23456")}


def test_a_declared_master_port_wins_over_the_agents() -> None:
    job = msgspec.structs.replace(TRAIN, workers="per-gpu", env={"MASTER_PORT": "29411"})
    result = desired_jobs(
        DesiredInputs(
            policy(job),
            HOST,
            {"train": assigned(gpus=(0,))},
            {},
            INVENTORY,
            {},
            {},
            ports={"train": 23456},
        )
    )
    assert result["train"].workers[0].env["MASTER_PORT"] == "29411"


def test_a_job_held_by_allocator_run_is_counted_held_but_never_run_by_the_agent() -> None:
    from allocator.records.types import RunHolder

    held = msgspec.structs.replace(assigned(), run=RunHolder(pid=4242, start_ticks=9))
    want = one(policy(), held)  # train is declared: the agent would run it otherwise
    assert (want.state, want.workers, want.gpus) == ("undeclared", (), (2, 1))
    assert want.message == "held by `allocator run` (pid 4242); not run by the agent"


def test_a_submitted_job_says_who_submitted_it_and_that_the_agent_runs_it() -> None:
    from allocator.records.types import RunHolder

    held = msgspec.structs.replace(
        assigned(job="batch"), holder="alice", run=RunHolder(pid=4242, launched_by="submit")
    )
    want = one(policy(), held)
    assert want.state == "undeclared" and want.workers == ()
    assert want.message == f"submitted by alice (job batch, run by the agent on {HOST})"


def test_a_host_the_policy_no_longer_names_runs_none_of_its_jobs_and_says_why() -> None:
    from allocator.records.types import RunHolder

    held = msgspec.structs.replace(
        assigned(job="notebook", gpus=(3,)), run=RunHolder(pid=42, launched_by="run")
    )
    inputs = DesiredInputs(
        policy(), HOST, {"train": assigned(), "notebook": held}, {"train": 5, "notebook": 6},
        INVENTORY, {}, {}, host_named=False,
    )  # fmt: skip
    result = desired_jobs(inputs)
    assert result["train"].state == "refused" and not result["train"].workers
    assert result["train"].message.startswith(f"host '{HOST}' is not in the applied policy")
    assert result["train"].grace_seconds == TRAIN.grace_seconds  # stopped as the policy says
    assert result["notebook"].state == "undeclared"  # a run's holding: its process ends it
