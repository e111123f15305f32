"""What the shim runs for a containerised worker: the engine, in the foreground.

The worker's shim runs ``ENGINE run --rm --name NAME ...`` (see
:mod:`allocator.agent.planning.containers`) instead of the worker's command,
so everything the shim does for a host worker holds for the container: its
status file, exit code (the engine's ``run`` exits with the container's),
log (the engine's output is the container's), and adoption after the agent
is killed (the shim outlives the agent, and so does the engine process under
it). The engine runs as the agent; the job's user, if any, is the
container's (``--user UID:GID``), with the host GIDs of the groups that own
the vendor's device nodes (``--group-add GID``: not ``keep-groups``, which
keeps the engine's own groups, the agent's, and needs crun; not the names,
which the image's /etc/group may lack), and its ``cwd`` the container's
``--workdir``.

A stop is the engine's own: the shim is told, as a setting, the command
``ENGINE stop -t GRACE NAME``, which it runs on a stop instead of signalling
the tree (the container's processes are the engine's children, not the
shim's). The agent's SIGKILL after the grace period still reaches everything
below the shim (the engine's monitor process re-parents to the shim, a
subreaper), as for a host worker.
"""

from __future__ import annotations

import grp
import math
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from allocator.agent.planning.containers import cid_path, container_argv, container_name
from allocator.agent.planning.types import DesiredJob
from allocator.agent.processes.job_state import WorkerRuntime
from allocator.agent.processes.users import RunAs

__all__ = [
    "STOP_SEPARATOR",
    "STOP_SETTING",
    "ContainerLaunch",
    "EngineMissing",
    "container_launch",
    "group_ids",
    "remove_orphaned_container",
]

#: The shim's setting holding the stop command (its words joined by STOP_SEPARATOR).
STOP_SETTING = "stop"
STOP_SEPARATOR = "\x1f"
#: How long the engine may take to remove a container left without its shim.
_REMOVE_TIMEOUT_SECONDS = 30.0
#: Containers removed by this agent after their shim was gone (names are unique per launch).
_REMOVED: set[str] = set()


class EngineMissing(Exception):
    """The container engine the policy names is not on the agent's PATH."""


@dataclass(frozen=True, slots=True)
class ContainerLaunch:
    """The shim's worker command, its environment, and its settings for one container."""

    argv: tuple[str, ...]
    env: dict[str, str]
    settings: dict[str, str]
    status: dict[str, str]
    name: str


def container_launch(
    job: DesiredJob, worker: WorkerRuntime, base_env: Mapping[str, str], run_as: RunAs | None
) -> ContainerLaunch:
    """The engine command for a prepared ``worker``; :class:`EngineMissing` without an engine.

    The container is named after the worker's status file, unique per launch,
    so a restart never meets its predecessor's container under the same name.
    """
    spec, run = worker.spec, worker.spec.container
    if run is None:
        raise ValueError(f"worker {spec.index} of job {spec.job!r} runs no container")
    engine = shutil.which(run.engine, path=base_env.get("PATH"))
    if engine is None:
        raise EngineMissing(f"container engine {run.engine!r} is not on the agent's PATH")
    name = container_name(Path(worker.status_path).stem)
    argv = container_argv(
        run,
        name=name,
        env_names=tuple(spec.env),
        argv=spec.argv,
        cwd=spec.cwd,
        user=f"{run_as.uid}:{run_as.gid}" if run_as is not None else None,
        engine_path=engine,
        group_ids=group_ids(run.device_groups),
        cpus=spec.cpus,
        mems=spec.mems,
        cidfile=cid_path(worker.status_path),
    )
    stop = [engine, "stop", "-t", str(math.ceil(max(job.grace_seconds, 0.0))), name]
    return ContainerLaunch(
        argv=argv,
        # The engine's own settings (PATH, CONTAINERS_CONF, ...) and the worker's
        # variables, which `--env NAME` copies into the container by name.
        env={**base_env, **spec.env},
        settings={STOP_SETTING: STOP_SEPARATOR.join(stop)},
        status={"container": name, "engine": engine},
        name=name,
    )


def group_ids(names: tuple[str, ...]) -> tuple[int, ...]:
    """The host GIDs of the groups ``names`` (a group the host lacks owns no node)."""
    found: list[int] = []
    for name in names:
        try:
            found.append(grp.getgrnam(name).gr_gid)
        except KeyError:
            continue
    return tuple(found)


def remove_orphaned_container(name: str, engine: str, recorded_exit: int | None) -> bool:
    """Remove the container ``name`` whose shim is gone; True once it surely is.

    A shim killed outright takes the engine's ``run`` process with it, but
    not the container (the engine's monitor re-parents): it would keep its
    GPUs while the agent starts the worker again. So, unless the shim saw
    the engine's ``run`` return (``recorded_exit``: it removed the container,
    ``--rm``; unless it was killed, 137), the
    container is removed here (SIGKILL, no grace: its supervisor is gone).
    Called only for a worker whose shim ended; it blocks for the engine's
    answer, which is rare enough (a shim that died) to be worth the wait.
    """
    if not name or name in _REMOVED or (recorded_exit is not None and recorded_exit != 128 + 9):
        return True
    # The engine's own settings (CONTAINERS_CONF...) but no store credential.
    from allocator.agent.kernel.procs import clean_base_env

    quick = ["-t", "0"] if os.path.basename(engine) == "podman" else []
    try:
        subprocess.run(
            [engine, "rm", "-f", *quick, name],
            env=clean_base_env(os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_REMOVE_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False  # tried again on the next tick
    _REMOVED.add(name)
    return True
