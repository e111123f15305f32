"""The environment each worker of a job starts with (pure).

Which variables make a worker's devices visible is the vendor's business
(:mod:`allocator.gpus.vendors.registry`: ``CUDA_VISIBLE_DEVICES`` on NVIDIA,
``ROCR_VISIBLE_DEVICES`` on AMD, ``ZE_AFFINITY_MASK`` on Intel, nothing on
Apple); every worker also gets ``ALLOCATOR_VENDOR`` and ``ALLOCATOR_DEVICE``
(the PyTorch device type: ``cuda``, ``xpu``, ``mps``, or ``cpu``). Intel's
``ZE_AFFINITY_MASK`` filters but never reorders (Level Zero keeps the
driver's order, PCI order here), so an Intel worker's GPUs are listed in PCI
order, mask and ``ALLOCATOR_GPUS`` alike: ``xpu:0`` is the lowest-PCI
assigned GPU, whatever order the assignment gave. On NVIDIA, the rules, from
how CUDA reads its environment:

* ``CUDA_VISIBLE_DEVICES`` lists the job's GPUs in the assignment's order
  (CUDA renumbers visible devices from 0 in listed order, so the first
  listed GPU is ``cuda:0``): GPU UUIDs when the policy says
  ``visible_devices: uuid`` and every assigned GPU's UUID is known, else
  NVML indices; never both, never a duplicate, never a space.
* ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` always, so indices mean what NVML's
  (PCI-ordered) indices mean; ``NVIDIA_VISIBLE_DEVICES`` repeats the list
  for containers.
* A GPU in MIG mode is handed out as its first MIG instance's UUID
  (``MIG-...``): one worker per MIG instance is out of scope. A process
  enumerates at most one MIG device, so a worker given a MIG GPU gets
  exactly that one device: two or more GPUs in one worker, any of them in
  MIG mode, is a :class:`~allocator.errors.RequestError`. (Indices cannot
  name a MIG instance, so MIG UUIDs are used even under ``index``.)
* CPU (an assignment with ``mode="cpu"`` or a fallback): ``CUDA_VISIBLE_DEVICES``
  is the empty string (never unset, never ``-1``), ``NVIDIA_VISIBLE_DEVICES=void``,
  ``ALLOCATOR_DEVICE=cpu``, ``ALLOCATOR_FALLBACK_REASON``, and
  ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` from the job's fallback rule.
* A job with ``container:`` runs each worker in a container holding exactly its
  GPUs, which numbers them from 0: its visibility variables hold the
  container's numbers, or ids its runtime takes (NVIDIA and AMD UUIDs), and
  ``NVIDIA_VISIBLE_DEVICES=void`` (the engine injected the devices).
* ``ALLOCATOR_GPU_COUNT``: how many GPUs the worker sees (0 on CPU), in
  every mode. ``workers: torchrun`` is one worker like ``single`` (the agent
  puts torchrun in front of its command).
* ``workers: per-gpu``: one worker per GPU, each seeing only its GPU, with
  torchrun's single-node variables (``RANK`` = ``LOCAL_RANK``, ``WORLD_SIZE`` =
  ``LOCAL_WORLD_SIZE`` = number of GPUs, ``MASTER_ADDR``, ``MASTER_PORT``).
  On CPU a per-GPU job runs one worker (rank 0 of 1).
* A share of a job across several hosts (a :class:`NodeGroup`) gets
  ``ALLOCATOR_NODE_RANK``, ``ALLOCATOR_NNODES``, ``MASTER_ADDR`` and the job's
  one ``MASTER_PORT`` in every mode (enough for ``torchrun --nnodes
  --node-rank``); per-gpu workers also get torchrun's global ``RANK`` (node
  rank x local world size + local rank), ``WORLD_SIZE`` (nodes x local world
  size), ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the node
  rank). Every share holds as many GPUs as the others (or all run on CPU, one
  worker each), so every rank computes the same world.
"""

from __future__ import annotations

import re
import shlex
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from allocator.errors import RequestError
from allocator.gpus.vendors.registry import DeviceVendor, vendor_named
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

if TYPE_CHECKING:  # the policy is the layer above: read here, never imported
    from allocator.policy.model import Policy

__all__ = [
    "MASTER_PORT_RANGE",
    "NodeGroup",
    "default_master_port",
    "render_exports",
    "worker_environments",
]

#: Derived MASTER_PORTs fall in [20000, 30000): unprivileged, and below
#: Linux's default ephemeral range (32768-60999) so a client socket never holds it.
MASTER_PORT_RANGE = (20000, 30000)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Where one host's share sits in a job across several hosts, and where ranks meet."""

    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int

    def env(self) -> dict[str, str]:
        """The variables every worker of the share gets, whatever its mode."""
        return {
            "ALLOCATOR_NODE_RANK": str(self.node_rank),
            "ALLOCATOR_NNODES": str(self.nnodes),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def default_master_port(job: str) -> int:
    """A MASTER_PORT derived from the job name: the same on every run and host."""
    low, high = MASTER_PORT_RANGE
    return low + zlib.crc32(job.encode()) % (high - low)


def worker_environments(
    assignment: Assignment,
    inventory: Sequence[GpuInfo] | None,
    policy: Policy,
    *,
    fallback_reason: str | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    group: NodeGroup | None = None,
    vendor: str | None = None,
    per_gpu: bool = False,
) -> list[dict[str, str]]:
    """One dict per worker: the variables to add to (override in) the job's env.

    ``inventory`` is the host's GPUs (``None`` if unknown: indices are used),
    ``vendor`` whose they are (``None``: NVIDIA).
    ``group`` places a share of a job across several hosts (its rendezvous
    then replaces ``master_addr``/``master_port``). ``per_gpu``: one worker
    per GPU even for a job the policy does not declare (``allocator run --per-gpu``).
    Raises :class:`RequestError` for an assignment no environment can express.
    """
    job = policy.jobs.get(assignment.job)
    per_gpu = job.workers == "per-gpu" if job is not None else per_gpu
    if group is not None:
        _checked_port(group.master_port)
        master_addr, master_port = group.master_addr, group.master_port
    port = _checked_port(master_port) if master_port is not None else None
    try:
        devices = vendor_named(vendor)
    except ValueError as exc:  # a vendor from a newer agent's record, say
        raise RequestError(f"host {assignment.host}: {exc}") from None
    base = {
        "ALLOCATOR_JOB": assignment.job,
        "ALLOCATOR_HOST": assignment.host,
        "ALLOCATOR_VENDOR": devices.name,
        **devices.order_env(),
        **(group.env() if group is not None else {}),
    }
    if assignment.mode == "cpu" or fallback_reason is not None:
        env = {**base, **_cpu_env(assignment, policy, fallback_reason, devices)}
        if per_gpu:
            env.update(_rank_env(0, 1, master_addr, port, assignment.job, group))
        return [env]
    gpus = _checked_gpus(assignment)
    if devices.numbers_in_pci_order:
        # Listing the GPUs in the runtime's (PCI) order keeps ALLOCATOR_GPUS[i]
        # the GPU that is device i.
        gpus = tuple(sorted(gpus))
    known = _known(inventory, gpus)
    boxed = job is not None and job.container is not None
    prefer_uuid = policy.visible_devices == "uuid"
    if per_gpu:
        return [
            {
                **base,
                **_gpu_env(
                    (gpu,), _ids((gpu,), known, prefer_uuid, devices, boxed), devices, boxed
                ),
                **_rank_env(rank, len(gpus), master_addr, port, assignment.job, group),
            }
            for rank, gpu in enumerate(gpus)
        ]
    ids = _ids(gpus, known, prefer_uuid, devices, boxed)
    if len(gpus) > 1 and any(info.mig_enabled for info in known.values()):
        raise RequestError(
            f"job {assignment.job}: GPUs {_join(gpus)} in one worker include a MIG-enabled "
            "GPU; a process sees only one MIG device (assign it alone, or use workers: per-gpu)"
        )
    return [{**base, **_gpu_env(gpus, ids, devices, boxed)}]


def render_exports(env: Mapping[str, str]) -> str:
    """Shell ``export NAME=value`` lines, quoted so ``eval "$(...)"`` restores ``env``."""
    lines: list[str] = []
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            raise RequestError(f"{name!r} is not a valid environment variable name")
        lines.append(f"export {name}={shlex.quote(value)}")
    return "".join(line + "\n" for line in lines)


def _checked_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise RequestError(f"MASTER_PORT must be 1-65535, got {port}")
    return port


def _checked_gpus(assignment: Assignment) -> tuple[int, ...]:
    gpus = assignment.gpus
    if not gpus:
        raise RequestError(f"job {assignment.job}: a GPU assignment with no GPUs")
    if any(gpu < 0 for gpu in gpus):
        raise RequestError(f"job {assignment.job}: negative GPU index in {list(gpus)}")
    if len(set(gpus)) != len(gpus):
        raise RequestError(f"job {assignment.job}: GPU listed twice in {list(gpus)}")
    return gpus


def _known(inventory: Sequence[GpuInfo] | None, gpus: tuple[int, ...]) -> dict[int, GpuInfo]:
    """The assigned GPUs' inventory entries (empty when the inventory is unknown)."""
    if inventory is None:
        return {}
    by_index = {gpu.index: gpu for gpu in inventory}
    missing = [gpu for gpu in gpus if gpu not in by_index]
    if missing:
        raise RequestError(
            f"GPU {_join(missing)} not on this host (it has {_join(sorted(by_index)) or 'none'})"
        )
    return {gpu: by_index[gpu] for gpu in gpus}


def _ids(
    gpus: Sequence[int],
    known: Mapping[int, GpuInfo],
    prefer_uuid: bool,
    devices: DeviceVendor,
    boxed: bool,
) -> tuple[str, ...]:
    """The visibility entries of ``gpus``: a container's own numbers (or ids its
    runtime takes) when the worker runs in one, which holds exactly ``gpus``."""
    if boxed:
        return tuple(devices.container_ids(gpus, known, prefer_uuid))
    return tuple(devices.device_ids(gpus, known, prefer_uuid))


def _gpu_env(
    gpus: Sequence[int], ids: Sequence[str], devices: DeviceVendor, boxed: bool
) -> dict[str, str]:
    return {
        **(devices.container_env(ids) if boxed else devices.visible_env(ids)),
        "ALLOCATOR_DEVICE": devices.torch_device_type,
        "ALLOCATOR_GPUS": _join(gpus),
        "ALLOCATOR_GPU_COUNT": str(len(gpus)),
    }


def _cpu_env(
    assignment: Assignment, policy: Policy, reason: str | None, devices: DeviceVendor
) -> dict[str, str]:
    why = reason or assignment.fallback_reason or assignment.reason or "assigned to CPU"
    env = {
        **devices.no_device_env(),
        "ALLOCATOR_DEVICE": "cpu",
        "ALLOCATOR_GPUS": "",
        "ALLOCATOR_GPU_COUNT": "0",
        "ALLOCATOR_FALLBACK_REASON": why.replace("\x00", ""),
    }
    rule = policy.fallback_for(assignment.job)
    if rule is not None and rule.action == "cpu" and rule.threads:
        threads = str(rule.threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, ALLOCATOR_THREADS=threads)
    return env


def _rank_env(
    rank: int, world: int, addr: str, port: int | None, job: str, group: NodeGroup | None
) -> dict[str, str]:
    """torchrun's variables for local rank ``rank`` of ``world`` workers on this host."""
    env = {
        "LOCAL_RANK": str(rank),
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port if port is not None else default_master_port(job)),
    }
    if group is not None:
        env.update(
            RANK=str(group.node_rank * world + rank),
            WORLD_SIZE=str(group.nnodes * world),
            GROUP_RANK=str(group.node_rank),
        )
    return env


def _join(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)
