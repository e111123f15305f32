"""The ``container:`` field of a job: its spec and the checks of its words.

```yaml
jobs:
  train:
    command: [python, train.py]
    container:
      image: registry.example/train:1.4
      engine: podman            # or docker
      args: [--shm-size=8g]     # engine arguments before the image
      mounts: [/data:/data:ro]  # HOST:CONTAINER[:OPTIONS]
```

The agent chooses the devices, the environment, the name and the labels
(see :mod:`allocator.agent.planning.containers`); ``args`` may not undo that,
so the engine options that would give a worker other devices or hide it from
the agent are refused here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocator.policy.model import Container
from allocator.policy.yamlspec.kinds import Enum, Str
from allocator.policy.yamlspec.structures import Field, ListOf, Record

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "CONTAINER",
    "ENGINE_SWITCHES",
    "ENGINE_VALUE_OPTIONS",
    "MAX_CONTAINER_WORDS",
    "REFUSED_ENGINE_OPTIONS",
    "engine_argument_problem",
]

MAX_CONTAINER_WORDS = 256
_MAX_WORD = 4096
_MOUNT_OPTIONS = frozenset({"ro", "rw", "z", "Z", "rshared", "rslave", "rprivate", "U"})
#: Engine options the agent sets itself, or that would widen what a worker sees
#: (every device, the host's environment) or detach it from its shim: named in
#: the refusal so the policy's author knows why.
REFUSED_ENGINE_OPTIONS = (
    "--device",
    "--gpus",
    "--privileged",
    "--env",
    "-e",
    "--env-file",
    "--env-host",
    "--name",
    "--label",
    "-l",
    "--rm",
    "--detach",
    "-d",
    "--cidfile",
    "--restart",
)
#: The only engine arguments accepted, each one whole word: ``--NAME=VALUE`` for
#: those that take a value, ``--NAME`` for the switches. An allow-list, not a
#: parse of the engine's grammar: short options (``-itd``, ``-eX=1``, ``-u 0``)
#: and values in a word of their own are refused, so no spelling can hide an
#: option the agent owns or one that widens the worker's devices or rights.
ENGINE_VALUE_OPTIONS = frozenset(
    {
        "--shm-size",
        "--cgroup-parent",  # where the engine's cgroup manager puts it (systemd slices)
        "--ipc",
        "--network",
        "--memory",
        "--memory-swap",
        "--memory-reservation",
        "--cpus",
        "--cpu-shares",
        "--pids-limit",
        "--ulimit",
        "--tmpfs",
        "--cap-drop",
        "--entrypoint",
        "--pull",
        "--hostname",
        "--stop-signal",
    }
)
ENGINE_SWITCHES = frozenset({"--init", "--read-only", "--no-healthcheck"})


class EngineArgument(Str):
    """One engine argument: an allowed ``--NAME=VALUE`` or ``--NAME``."""

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse what :class:`Str` refuses and every word the allow-list does not name."""
        found = super().problem(value, node)
        if found is not None:
            return found
        return engine_argument_problem(value)


def engine_argument_problem(word: str) -> str | None:
    """Why ``word`` may not be an engine argument (``None``: it may)."""
    option, has_value, rest = word.partition("=")
    if option in REFUSED_ENGINE_OPTIONS:
        return (
            f"{option} is the agent's to set (devices, environment, name, labels and "
            "lifetime come from the assignment); remove it"
        )
    if not option.startswith("--"):
        return f"{word!r}: short options and bare values are not accepted; write --NAME=VALUE"
    if option in ENGINE_VALUE_OPTIONS and has_value and rest:
        return None
    if option in ENGINE_SWITCHES and not has_value:
        return None
    if option in ENGINE_VALUE_OPTIONS:
        return f"{word!r}: write the value in the same word, {option}=VALUE"
    return f"{word!r} is not an accepted engine argument (see docs/containers.md)"


class Mount(Str):
    """``HOST:CONTAINER[:OPTIONS]``, both paths absolute: passed as ``--volume``."""

    expected = "a mount like /data:/data:ro"

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but two absolute paths and known options."""
        found = super().problem(value, node)
        if found is not None:
            return found
        parts = value.split(":")
        if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]):
            return f"must be HOST:CONTAINER[:OPTIONS] with absolute paths, got {value!r}"
        if parts[0] == "/" or parts[0].rstrip("/") == "/dev" or parts[0].startswith("/dev/"):
            return f"{value!r}: the host's devices come from the assignment, never a mount"
        if len(parts) == 3 and not set(parts[2].split(",")) <= _MOUNT_OPTIONS:
            known = ", ".join(sorted(_MOUNT_OPTIONS))
            return f"unknown mount option in {parts[2]!r} (known: {known})"
        return None


CONTAINER = Record(
    Container,
    (
        Field(
            "image",
            Str(max_length=_MAX_WORD),
            "The image each worker runs in (a name the engine resolves; pulled by the "
            "engine as it would for `run`).",
            required=True,
        ),
        Field("engine", Enum("podman", "docker"), "The container engine on the host."),
        Field(
            "args",
            ListOf(EngineArgument(max_length=_MAX_WORD), max_items=MAX_CONTAINER_WORDS),
            "Engine arguments put before the image, each one word: --NAME=VALUE for "
            + ", ".join(sorted(ENGINE_VALUE_OPTIONS))
            + "; or one of "
            + ", ".join(sorted(ENGINE_SWITCHES))
            + ". Anything else is refused.",
        ),
        Field(
            "mounts",
            ListOf(Mount(max_length=_MAX_WORD), max_items=MAX_CONTAINER_WORDS),
            "Bind mounts, HOST:CONTAINER[:OPTIONS], each passed as --volume.",
        ),
        Field(
            "devices",
            Enum("cdi", "gpus"),
            "How the engine is told the worker's GPUs: cdi (CDI names such as "
            "nvidia.com/gpu=UUID; the default under podman, and under docker on AMD and Intel "
            "hosts: docker 25 or later with CDI enabled) or gpus (docker's --gpus with "
            "NVIDIA's container toolkit; the default under docker on NVIDIA hosts).",
        ),
    ),
    description="Run each worker as a container that sees exactly its GPUs.",
)
