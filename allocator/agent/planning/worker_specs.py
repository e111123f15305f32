"""A job that should run: its workers' commands, environments, GPUs and containers.

Workers on shared GPUs are told their share (:mod:`allocator.agent.planning.gpu_shares`);
a containerised worker sees exactly its GPUs (:mod:`allocator.agent.planning.containers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.agent.planning.across_hosts import Share
from allocator.agent.planning.command_line import torchrun_group, worker_argv
from allocator.agent.planning.containers import ContainerRun, container_run
from allocator.agent.planning.gpu_shares import share_env
from allocator.agent.planning.outcomes import not_running, outcome
from allocator.agent.planning.types import DesiredJob, Device, WorkerSpec
from allocator.errors import RequestError
from allocator.placement.choose import pool_sharing
from allocator.placement.worker_env import NodeGroup
from allocator.policy.model import Job, Policy, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

__all__ = ["Rendezvous", "running"]


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where a job's ranks meet (MASTER_ADDR and MASTER_PORT, or its share across
    hosts), and where the MPS daemons of its shared GPUs listen."""

    addr: str
    port: int | None
    share: Share | None = None
    mps_dir: str | None = None
    vendor: str | None = None  # whose GPUs the host has, which says how to show them

    @property
    def group(self) -> NodeGroup | None:
        """The share's place in a job across hosts, once its MASTER_ADDR is known."""
        return self.share.group if self.share is not None else None


def running(
    policy: Policy,
    job: Job,
    assignment: Assignment,
    argv: tuple[str, ...],
    revision: int,
    inventory: Sequence[GpuInfo] | None,
    message: str,
    rank: Rendezvous,
    fault: str | None = None,
) -> DesiredJob:
    """A job that should run: one WorkerSpec per rendered environment."""
    # Imported here: the sibling module is the one place environments are rendered.
    from allocator.placement.worker_env import worker_environments

    if rank.share is not None and rank.group is None:  # its ranks would have nowhere to meet
        waiting = "; ".join(m for m in (message, rank.share.waiting_for) if m)
        return not_running(job, assignment, revision, "wait", waiting, fault)
    try:
        envs = worker_environments(
            assignment,
            inventory,
            policy,
            fallback_reason=assignment.fallback_reason if assignment.mode == "cpu" else None,
            master_addr=rank.addr,
            master_port=rank.port,
            group=rank.group,
            vendor=rank.vendor,
        )
    except RequestError as exc:
        return not_running(job, assignment, revision, "refused", _naming(job, str(exc)))
    sharing = pool_sharing(policy, assignment.host)
    refusal = _mps_refusal(job, assignment, sharing)
    if refusal is not None:
        return not_running(job, assignment, revision, "refused", refusal)
    device: Device = "cpu" if assignment.mode == "cpu" else "cuda"
    try:
        workers = _workers(
            policy, job, assignment, argv, revision, inventory, rank, sharing, envs, device
        )
    except RequestError as exc:  # devices no container engine can be given
        return not_running(job, assignment, revision, "refused", _naming(job, str(exc)))
    return outcome(job, assignment, revision, "run", message, workers, device, fault)


def _mps_refusal(job: Job, assignment: Assignment, sharing: Sharing) -> str | None:
    """Why a one-worker job cannot run on these GPUs under MPS, or ``None``."""
    one_worker = job.workers in ("single", "torchrun")
    mps_single = sharing.mode == "mps" and one_worker and not assignment.exclusive
    if mps_single and len(assignment.gpus) > 1 and assignment.mode == "gpu":
        return (
            f"job {job.name!r} runs one worker on GPUs {','.join(map(str, assignment.gpus))}, "
            "but under MPS a worker uses one GPU (one control daemon per GPU)"
        )
    return None


def _workers(
    policy: Policy,
    job: Job,
    assignment: Assignment,
    argv: tuple[str, ...],
    revision: int,
    inventory: Sequence[GpuInfo] | None,
    rank: Rendezvous,
    sharing: Sharing,
    envs: Sequence[Mapping[str, str]],
    device: Device,
) -> tuple[WorkerSpec, ...]:
    """One WorkerSpec per rendered environment, with the job's own and shared-GPU variables."""
    gpus = [_worker_gpus(assignment, job, index) for index in range(len(envs))]
    # A torchrun job's rendezvous is in its environment too (as per-gpu ranks have it),
    # so the agent publishes its MASTER_PORT and `allocator env` shows it.
    torchrun = torchrun_group(job.name, rank.group, rank.addr, rank.port)
    meet = torchrun.env() if job.workers == "torchrun" else {}
    full = [
        {
            **job.env,
            **meet,
            **env,
            **share_env(sharing, assignment, gpus[i], inventory, rank.mps_dir),
        }
        for i, env in enumerate(envs)
    ]
    return tuple(
        WorkerSpec(
            job=job.name,
            index=index,
            argv=worker_argv(job, argv, env, torchrun, len(gpus[index]) or 1),
            env=env,
            cwd=job.cwd,
            gpus=gpus[index],
            device=device,
            user=job.user,
            group=job.group,
            container=_container(
                policy, job, assignment, (index, revision), gpus[index], inventory, rank.vendor
            ),
        )
        for index, env in enumerate(full)
    )


def _container(
    policy: Policy,
    job: Job,
    assignment: Assignment,
    worker: tuple[int, int],
    gpus: tuple[int, ...],
    inventory: Sequence[GpuInfo] | None,
    vendor: str | None,
) -> ContainerRun | None:
    """Worker ``index``'s container, seeing exactly ``gpus`` (by its vendor's CDI kind);
    None for a host process."""
    if job.container is None:
        return None
    index, revision = worker
    return container_run(
        job.container,
        host=assignment.host,
        job=job.name,
        index=index,
        revision=revision,
        gpus=gpus,
        inventory=inventory,
        vendor=vendor or "nvidia",
        cdi_names=policy.cdi_names_of(assignment.host),
    )


def _naming(job: Job, message: str) -> str:
    """``message``, led by the job's name unless it already names the job."""
    return message if message.startswith(f"job {job.name}") else f"job {job.name}: {message}"


def _worker_gpus(assignment: Assignment, job: Job, index: int) -> tuple[int, ...]:
    """The physical GPUs worker ``index`` sees: its own one in per-gpu mode."""
    if assignment.mode == "cpu":
        return ()
    if job.workers == "per-gpu":
        return assignment.gpus[index : index + 1]
    return assignment.gpus
