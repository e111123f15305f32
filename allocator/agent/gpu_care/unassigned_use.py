"""Unassigned GPU use: processes NVML lists on a GPU that no job running there was given.

A process belongs to a job when it is in one of the job's worker trees: below
the worker's shim (a child subreaper, so nothing escapes it by ``setsid``),
or in the worker's cgroup (which holds the tree even after the shim died),
or in the worker's container: docker's containers are the daemon's children,
not the shim's, so a containerised worker's processes are found by the
container's id (which the engine wrote to the worker's ``--cidfile``) in
their ``/proc/<pid>/cgroup`` (``docker-<ID>.scope``, ``/docker/<ID>``,
``libpod-<ID>.scope``).
Such a process on a GPU its job was given is the job's business; anything
else on a GPU is reported: another user's notebook, a process started by
hand, or one of our own workers on a GPU it was not given (it bypassed
``CUDA_VISIBLE_DEVICES``).

Finding owners reads ``/proc`` and the worker cgroups (:func:`find_owners`);
deciding what is unassigned is pure (:func:`unassigned_processes`).

NVML reports process ids as the host's PID namespace sees them. An agent in
a container without the host's PID namespace cannot match them to its
workers; it reports such processes without user and command.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import cgroup_members
from allocator.gpus.usage import GpuUsage
from allocator.records.types import GpuProcess

__all__ = [
    "MEMORY_STEP_FRACTION",
    "TreeRoot",
    "describe_process",
    "find_owners",
    "read_proc_cgroup",
    "steady_memory",
    "unassigned_processes",
]

#: A published process's memory is updated only when it moved by more than this
#: fraction (or 256 MiB, whichever is more): the agent record is rewritten
#: when its content changes, and NVML's byte counts change all the time.
MEMORY_STEP_FRACTION = 0.25
_MEMORY_STEP_MIB = 256
_MAX_DEPTH = 128  # deeper than any real process tree; stops a /proc race from looping
_COMMAND_LENGTH = 512
_MIN_CONTAINER_ID = (
    32  # docker's and podman's ids are 64 hex digits: no short one matches by chance
)


@dataclass(frozen=True, slots=True)
class TreeRoot:
    """The root of one worker's process tree: its shim (pid + start time), cgroup, container.

    ``cidfile``: where the engine writes the worker's container id ("" for a host worker).
    """

    pid: int
    start_ticks: int | None
    cgroup: str = ""
    cidfile: str = ""


def read_proc_cgroup(pid: int, proc: Path = Path("/proc")) -> str:
    """The text of ``/proc/<pid>/cgroup``; "" when the process is gone."""
    try:
        return (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return ""


def find_owners(
    pids: Iterable[int],
    roots: Mapping[str, Sequence[TreeRoot]],
    *,
    read_stat: Callable[[int], procs.ProcStat | None] = procs.read_stat,
    members: Callable[[Path], list[int]] = cgroup_members,
    read_cgroup: Callable[[int], str] = read_proc_cgroup,
) -> dict[int, str]:
    """The job each of ``pids`` belongs to (pids of no job are left out)."""
    wanted = set(pids)
    owners: dict[int, str] = {}
    by_root: dict[tuple[int, int | None], str] = {}
    for job, job_roots in sorted(roots.items()):
        for root in job_roots:
            by_root[(root.pid, root.start_ticks)] = job
            if root.cgroup:
                for pid in set(members(Path(root.cgroup))) & wanted:
                    owners.setdefault(pid, job)
    for pid in sorted(wanted - owners.keys()):
        owner = _owner_by_ancestry(pid, by_root, read_stat)
        if owner is not None:
            owners[pid] = owner
    containers = _container_ids(roots)
    for pid in sorted(wanted - owners.keys()) if containers else ():
        owner = _owner_by_container(read_cgroup(pid), containers)
        if owner is not None:
            owners[pid] = owner
    return owners


def _container_ids(roots: Mapping[str, Sequence[TreeRoot]]) -> dict[str, str]:
    """Each containerised worker's container id (as its engine wrote it), to its job."""
    found: dict[str, str] = {}
    for job, job_roots in sorted(roots.items()):
        for root in job_roots:
            if not root.cidfile:
                continue
            try:
                cid = Path(root.cidfile).read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError):
                continue  # not written yet (the engine writes it as the container starts)
            if len(cid) >= _MIN_CONTAINER_ID:
                found.setdefault(cid, job)
    return found


def _owner_by_container(cgroup: str, containers: Mapping[str, str]) -> str | None:
    """The job whose container's id names one of the cgroups in ``cgroup`` (/proc's text)."""
    for line in cgroup.splitlines():
        path = line.rpartition(":")[2]
        for cid, job in containers.items():
            if cid in path:
                return job
    return None


def _owner_by_ancestry(
    pid: int,
    by_root: Mapping[tuple[int, int | None], str],
    read_stat: Callable[[int], procs.ProcStat | None],
) -> str | None:
    current = pid
    for _ in range(_MAX_DEPTH):
        if current <= 1:
            return None
        stat = read_stat(current)
        if stat is None:
            return None
        found = by_root.get((current, stat.start_ticks)) or by_root.get((current, None))
        if found is not None:
            return found
        current = stat.ppid
    return None


def describe_process(pid: int) -> tuple[str, str]:
    """(user, command line) of ``pid``; empty strings where it cannot be seen."""
    import psutil  # only when something unassigned was found

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            user = process.username()
            command = " ".join(process.cmdline()) or process.name()
    except (psutil.Error, OSError):
        return "", ""
    return user, command[:_COMMAND_LENGTH]


def unassigned_processes(
    usage: Sequence[GpuUsage],
    given: Mapping[str, Iterable[int]],
    owners: Mapping[int, str],
    describe: Callable[[int], tuple[str, str]],
) -> tuple[GpuProcess, ...]:
    """Every process on a GPU that its job (if it has one) was not given, sorted by GPU and pid.

    ``given`` maps each job to the GPUs it may use on this host; ``owners``
    maps pids to jobs (:func:`find_owners`); ``describe`` gives a pid's user
    and command (called only for what is reported). The agent's own pid is
    never reported.
    """
    allowed = {job: set(gpus) for job, gpus in given.items()}
    found: list[GpuProcess] = []
    for gpu in sorted(usage, key=lambda u: u.index):
        for process in gpu.processes:
            job = owners.get(process.pid)
            legitimate = job is not None and gpu.index in allowed.get(job, ())
            if legitimate or process.pid == os.getpid():
                continue
            user, command = describe(process.pid)
            found.append(
                GpuProcess(
                    gpu=gpu.index,
                    pid=process.pid,
                    user=user,
                    command=command,
                    memory_used_mib=process.used_memory_mib,
                    job=job,
                )
            )
    return tuple(found)


def steady_memory(
    previous: Sequence[GpuProcess], current: Sequence[GpuProcess]
) -> tuple[GpuProcess, ...]:
    """``current`` with each process's memory kept at its published value unless it moved much."""
    published = {(p.gpu, p.pid): p.memory_used_mib for p in previous}
    result = []
    for process in current:
        old = published.get((process.gpu, process.pid))
        new = process.memory_used_mib
        if old is not None and new is not None and not _moved(old, new):
            process = GpuProcess(
                gpu=process.gpu,
                pid=process.pid,
                user=process.user,
                command=process.command,
                memory_used_mib=old,
                job=process.job,
            )
        result.append(process)
    return tuple(result)


def _moved(old: int, new: int) -> bool:
    return abs(new - old) > max(_MEMORY_STEP_MIB, MEMORY_STEP_FRACTION * old)
