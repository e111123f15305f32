"""A containerised worker's engine command line (pure).

A job with ``container:`` in the policy runs each worker as
``ENGINE run --rm --name NAME --label ... --env NAME ... [devices] IMAGE ARGV``,
in the foreground, under the worker's shim: the shim's supervision, exit
status and log are the container's (see docs/containers.md).

* Devices: exactly the worker's GPUs, by their CDI names as the vendor's
  own generator writes them (:meth:`~allocator.gpus.vendors.base.DeviceVendor.cdi_devices`:
  NVIDIA by UUID, a MIG GPU by its instance's UUID; AMD by index; Intel
  ``card<N>`` or its PCI-based id, as the host's ``cdi_names`` says; Apple
  none, refused), or docker's ``--gpus '"device=UUID,UUID"'`` (NVIDIA's
  toolkit without CDI; other vendors refused, and docker on their hosts
  defaults to CDI). On the CPU no device option
  at all: ``--gpus ""`` is read differently by different engines.
* Groups: a job user (``--user UID:GID``) is added to the host groups that
  own the vendor's device nodes (``render``, ``video`` on AMD and Intel), by
  GID: the nodes keep the host's GID in the container, and the image may
  not know the names.
* Environment: ``--env NAME`` for each of the worker's variables, never
  ``NAME=VALUE``: the engine takes the value from its own environment (the
  shim's hand-over), so no value is in any argv or ``ps``. Only the worker's
  variables go in (the agent's PATH or engine settings stay outside), and the
  worker's variables never hold a store credential.
* CPUs: ``--cpuset-cpus``/``--cpuset-mems`` with the worker's pinning:
  docker's containers are the daemon's children, so the shim's affinity
  would not reach them (under podman it is the same set, said twice).
* Labels: ``allocator.job``, ``allocator.host``, ``allocator.worker`` and
  ``allocator.revision`` (the assignment's), so that an operator, or an
  agent after a restart, can tell whose a container is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from allocator.errors import RequestError
from allocator.gpus.topology import cpu_list
from allocator.gpus.vendors.base import CdiNames
from allocator.gpus.vendors.registry import VENDORS, vendor_named
from allocator.policy.model import Container
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "CDI_KINDS",
    "LABEL_PREFIX",
    "ContainerRun",
    "cid_path",
    "container_argv",
    "container_name",
    "container_run",
]

#: The CDI kind of each vendor's devices (a GPU's partitions, MIG instances, included),
#: as each vendor module says it (Apple has none: no engine passes a Mac's GPU through).
CDI_KINDS: Mapping[str, str] = {name: v.cdi_kind for name, v in VENDORS.items() if v.cdi_kind}
LABEL_PREFIX = "allocator."
_NAME_PREFIX = "allocator-"


@dataclass(frozen=True, slots=True)
class ContainerRun:
    """What a worker's container is: the policy's part, its devices and its labels."""

    engine: str
    image: str
    args: tuple[str, ...]
    mounts: tuple[str, ...]
    device_options: tuple[str, ...]  # ("--device", "nvidia.com/gpu=GPU-1", ...) or ()
    labels: tuple[tuple[str, str], ...]
    device_groups: tuple[str, ...] = ()  # host groups owning the device nodes


def container_run(
    container: Container,
    *,
    host: str,
    job: str,
    index: int,
    revision: int,
    gpus: Sequence[int],
    inventory: Sequence[GpuInfo] | None,
    vendor: str = "nvidia",
    cdi_names: CdiNames = "card",
) -> ContainerRun:
    """The container of worker ``index`` of ``job`` on ``host``, seeing exactly ``gpus``.

    ``vendor``: whose GPUs the host has; ``cdi_names``: how its CDI spec names
    them where the vendor has two namings. :class:`RequestError` for devices
    no engine can be given (an Apple GPU; ``--gpus`` with another vendor's).
    """
    devices = vendor_named(vendor)
    labels = (
        (f"{LABEL_PREFIX}job", job),
        (f"{LABEL_PREFIX}host", host),
        (f"{LABEL_PREFIX}worker", str(index)),
        (f"{LABEL_PREFIX}revision", str(revision)),
    )
    return ContainerRun(
        engine=container.engine,
        image=container.image,
        args=container.args,
        mounts=container.mounts,
        device_options=_device_options(container, gpus, inventory, vendor, cdi_names),
        labels=labels,
        device_groups=devices.device_groups if gpus else (),
    )


def _device_options(
    container: Container,
    gpus: Sequence[int],
    inventory: Sequence[GpuInfo] | None,
    vendor: str,
    cdi_names: CdiNames,
) -> tuple[str, ...]:
    if not gpus:
        return ()  # the CPU: no device option at all
    known = {gpu.index: gpu for gpu in inventory or ()}
    if container.device_naming(vendor) == "gpus":
        if not _takes_docker_gpus(vendor):
            raise RequestError(
                f"devices: gpus is docker's NVIDIA-only option; {vendor} GPUs need devices: cdi"
            )
        ids = ",".join(_plain_id(known.get(index), index) for index in gpus)
        return ("--gpus", f'"device={ids}"')  # quoted: docker reads the value as CSV
    names = vendor_named(vendor).cdi_devices(gpus, known, cdi_names)
    return tuple(word for name in names for word in ("--device", name))


def _takes_docker_gpus(vendor: str) -> bool:
    devices = VENDORS.get(vendor)
    return devices is not None and devices.docker_gpus


def _plain_id(gpu: GpuInfo | None, index: int) -> str:
    """A GPU's id: its UUID where known (a MIG GPU: its first instance's), else its index."""
    if gpu is not None and gpu.mig_enabled and gpu.mig_devices:
        return gpu.mig_devices[0].uuid
    return gpu.uuid if gpu is not None and gpu.uuid else str(index)


def container_name(worker_key: str) -> str:
    """The container's name: the worker's status file name, unique per launch."""
    return _NAME_PREFIX + worker_key


def cid_path(status_path: str) -> str:
    """Where the engine writes the id of the container of the worker with ``status_path``.

    The agent finds the container's processes by it (docker's are not the shim's children).
    """
    return str(Path(status_path).with_suffix(".cid"))


def container_argv(
    run: ContainerRun,
    *,
    name: str,
    env_names: Sequence[str],
    argv: Sequence[str],
    cwd: str | None = None,
    user: str | None = None,
    engine_path: str | None = None,
    group_ids: Sequence[int] = (),
    cpus: Sequence[int] = (),
    mems: Sequence[int] = (),
    cidfile: str | None = None,
) -> tuple[str, ...]:
    """The engine command line that runs ``argv`` in the container, in the foreground.

    ``user`` (``UID:GID``) and ``cwd`` apply inside the container: the engine
    itself runs as the agent. ``engine_path``: the engine's resolved path.
    ``group_ids``: the host GIDs of ``run.device_groups``, added for a ``user``
    (root opens any device node). ``cpus``/``mems``: the worker's pinning, given
    to the engine (a docker container does not inherit the shim's). ``cidfile``:
    where the engine writes the container's id (:func:`cid_path`).
    """
    words = [engine_path or run.engine, "run", "--rm", "--name", name]
    if cidfile is not None:
        words.append(f"--cidfile={cidfile}")
    for key, value in run.labels:
        words += ["--label", f"{key}={value}"]
    for key in sorted(env_names):
        words += ["--env", key]
    for mount in run.mounts:
        words += ["--volume", mount]
    if user is not None:
        words += ["--user", user]
        for gid in group_ids if run.device_groups else ():
            words += ["--group-add", str(gid)]
    if cwd is not None:
        words += ["--workdir", cwd]
    if cpus:
        words.append(f"--cpuset-cpus={cpu_list(cpus)}")
    if mems:
        words.append(f"--cpuset-mems={cpu_list(mems)}")
    words += [*run.device_options, *run.args, run.image, *argv]
    return tuple(words)
