"""A worker's command line: ``$(VAR)`` references expanded, torchrun put in front (pure).

The policy's ``command`` is an argv, never given to a shell, so ``$VAR``
stays literal. What a command may refer to is expanded here, by the agent,
the way Kubernetes expands a container's ``command`` and ``args``:

* ``$(NAME)`` is replaced by the worker's variable ``NAME`` (the job's
  ``env``, then the allocator's: ``ALLOCATOR_GPU_COUNT``,
  ``ALLOCATOR_NODE_RANK``, ``MASTER_PORT`` ...);
* ``$$`` is one ``$``, so ``$$(NAME)`` is the text ``$(NAME)``;
* a name the worker's environment does not have is left as it is
  (``$(NOPE)`` stays ``$(NOPE)``), as Kubernetes does; so is a ``$`` not
  followed by ``(`` and a ``$(`` with no closing ``)``.

``workers: torchrun`` runs one worker, ``torchrun``, with the rendezvous
the agent computes for the job (the same as its per-gpu ranks get) and one
process per GPU (one on the CPU fallback), then the expanded command.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from allocator.placement.worker_env import NodeGroup, default_master_port
from allocator.policy.model import Job
from allocator.policy.references import expand_references

__all__ = [
    "TORCHRUN",
    "expand_command",
    "expand_references",
    "torchrun_argv",
    "torchrun_group",
    "worker_argv",
]

#: The launcher's program, found on the worker's PATH like any command.
TORCHRUN = "torchrun"


def expand_command(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """Every argument of ``argv`` expanded against ``env``."""
    return tuple(expand_references(argument, env) for argument in argv)


def torchrun_argv(
    *, nnodes: int, node_rank: int, master_addr: str, master_port: int, nproc_per_node: int
) -> tuple[str, ...]:
    """torchrun and its rendezvous options, to be followed by the script and its arguments."""
    return (
        TORCHRUN,
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        f"--nproc-per-node={nproc_per_node}",
    )


def torchrun_group(job: str, group: NodeGroup | None, addr: str, port: int | None) -> NodeGroup:
    """Where a torchrun job's nodes meet: its share across hosts (``group``), or this host
    alone at the agent's address and the job's port (derived from its name when unknown)."""
    if group is not None:
        return group
    return NodeGroup(0, 1, addr, port if port is not None else default_master_port(job))


def worker_argv(
    job: Job, argv: Sequence[str], env: Mapping[str, str], group: NodeGroup, nproc: int
) -> tuple[str, ...]:
    """The command with its ``$(VAR)`` references expanded; under torchrun when the job says.

    torchrun gets the rendezvous every rank of the job shares (``group``,
    from :func:`torchrun_group`) and ``nproc`` processes: one per GPU.
    """
    command = expand_command(argv, env)
    if job.workers != "torchrun":
        return command
    launcher = torchrun_argv(
        nnodes=group.nnodes,
        node_rank=group.node_rank,
        master_addr=group.master_addr,
        master_port=group.master_port,
        nproc_per_node=nproc,
    )
    return (*launcher, *command)
