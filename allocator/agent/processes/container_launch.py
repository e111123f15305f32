"""What the shim runs for a containerised worker: the engine, in the foreground.

The worker's shim runs ``ENGINE run --rm --name NAME ...`` (see
:mod:`allocator.agent.planning.containers`) instead of the worker's command,
so everything the shim does for a host worker holds for the container: its
status file, exit code (the engine's ``run`` exits with the container's),
log (the engine's output is the container's), and adoption after the agent
is killed (the shim outlives the agent, and so does the engine process under
it). The engine runs as the agent; the job's user, if any, is the
container's (``--user UID:GID``), and its ``cwd`` the container's
``--workdir``.

A stop is the engine's own: the shim is told, as a setting, the command
``ENGINE stop -t GRACE NAME``, which it runs on a stop instead of signalling
the tree (the container's processes are the engine's children, not the
shim's). The agent's SIGKILL after the grace period still reaches everything
below the shim (the engine's monitor process re-parents to the shim, a
subreaper), as for a host worker.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from allocator.agent.planning.containers import container_argv, container_name
from allocator.agent.planning.types import DesiredJob
from allocator.agent.processes.job_state import WorkerRuntime
from allocator.agent.processes.users import RunAs

__all__ = ["STOP_SEPARATOR", "STOP_SETTING", "ContainerLaunch", "EngineMissing", "container_launch"]

#: The shim's setting holding the stop command (its words joined by STOP_SEPARATOR).
STOP_SETTING = "stop"
STOP_SEPARATOR = "\x1f"


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
