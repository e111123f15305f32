"""The policy's ``jobs`` section and the ``fallback`` rules its jobs name."""

from __future__ import annotations

from allocator.gpus.vendors.registry import VISIBILITY_VARIABLES
from allocator.policy.container_field import CONTAINER
from allocator.policy.idle_rule import IDLE
from allocator.policy.model import FallbackRule, Job
from allocator.policy.on_change import OnChange
from allocator.policy.release_on_exit import ReleaseOnExit
from allocator.policy.spec_bounds import (
    ARGUMENT,
    DAY,
    HOUR,
    MAX_ARGUMENT_LENGTH,
    MAX_ARGUMENTS,
    MAX_ENV_ENTRIES,
    MAX_RESTARTS,
    MAX_THREADS,
)
from allocator.policy.yamlspec.kinds import Bool, Enum, Int, Name, Number, Str
from allocator.policy.yamlspec.structures import EnvMap, Field, ListOf, OnlyWhen, Record

__all__ = ["FALLBACK", "JOB", "RESERVED_ENV", "RESERVED_ENV_PREFIX"]

#: Set by the agent from the assignment; a job's ``env`` may not override them.
RESERVED_ENV = VISIBILITY_VARIABLES
RESERVED_ENV_PREFIX = "ALLOCATOR_"

JOB = Record(
    Job,
    (
        Field(
            "command",
            ListOf(ARGUMENT, min_items=1, max_items=MAX_ARGUMENTS, label="argument"),
            "Program and arguments a worker runs (no shell).",
            required=True,
        ),
        Field(
            "env",
            EnvMap(
                Str(nonempty=False, max_length=MAX_ARGUMENT_LENGTH),
                RESERVED_ENV,
                RESERVED_ENV_PREFIX,
                max_entries=MAX_ENV_ENTRIES,
            ),
            "Extra environment variables for the workers (CUDA_VISIBLE_DEVICES, "
            "NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and ALLOCATOR_* are set by the agent).",
        ),
        Field("cwd", Str(), "Working directory of the workers."),
        Field(
            "workers",
            Enum("single", "per-gpu", "torchrun"),
            "single: one worker sees all assigned GPUs; per-gpu: one worker per GPU, with "
            "torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT; torchrun: one worker, torchrun, started by the agent with --nnodes, "
            "--node-rank, --master-addr, --master-port and --nproc-per-node (the GPU count, 1 "
            "on the CPU fallback) before the command. A job set across several hosts "
            "(allocator set host=a,b) gets ALLOCATOR_NODE_RANK, ALLOCATOR_NNODES, MASTER_ADDR "
            "(the first host's) and one MASTER_PORT on every host in every mode; per-gpu ranks "
            "are then global and GROUP_RANK is the node rank.",
        ),
        Field(
            "on_change",
            OnChange(),
            "What a change of assignment does: restart the workers, nothing (none), "
            "or send a signal (signal:SIGHUP).",
        ),
        Field(
            "grace_seconds",
            Number(minimum=0, maximum=HOUR, why="an hour; longer and a hung worker holds its GPUs"),
            "Seconds between SIGTERM and SIGKILL when stopping a worker.",
        ),
        Field(
            "fallback",
            Name("fallback rule"),
            "Name of the fallback rule used when the job's GPUs are unavailable.",
        ),
        Field(
            "allow_adhoc_command",
            Bool(),
            "Whether an assignment may carry its own command instead of this one.",
        ),
        Field(
            "max_restarts",
            Int(minimum=0, maximum=MAX_RESTARTS),
            "Crash restarts allowed before the worker is left stopped.",
        ),
        Field(
            "restart",
            Enum("always", "on-failure", "never"),
            "When workers that ended by themselves start again: on-failure (default) after a "
            "non-zero exit, always after any exit, never (the job stays finished).",
        ),
        Field(
            "release_on_exit",
            ReleaseOnExit(),
            "Release the job's GPUs when its workers have all ended with one of these exit "
            "statuses (true: [0], the job finished; false: never, the default); such an "
            "end is never restarted.",
        ),
        Field(
            "restart_backoff_seconds",
            Number(minimum=0, maximum=HOUR, why="an hour"),
            "First delay before restarting a crashed worker; doubles on each crash.",
        ),
        Field(
            "restart_backoff_max_seconds",
            Number(minimum=0, maximum=DAY, why="a day"),
            "Cap of the crash-restart delay; at least restart_backoff_seconds.",
        ),
        Field(
            "user",
            Str(),
            "User the workers run as (a name or uid from the host's user database, with its "
            "supplementary groups); the agent must run as root to switch. Unset: the agent's "
            "own user. Required, and not root, when allow_adhoc_command is true.",
        ),
        Field(
            "group",
            Str(),
            "Group the workers run as (a name or gid). Unset: the user's primary group.",
        ),
        Field(
            "exclusive",
            Bool(),
            "Whether the job takes its GPUs whole even in a shared pool: it is never placed "
            "on a GPU another job holds, and no other job joins it.",
        ),
        Field(
            "cpu_affinity",
            Enum("local", "none"),
            "local: pin each worker to the CPUs local to its GPUs (and bind its memory to "
            "their NUMA nodes where numactl is installed); a CPU-fallback worker to as many "
            "CPUs as its rule's threads. none: leave workers unpinned.",
        ),
        Field("idle", IDLE, "Idle-holder rule for this job (overrides its pool's)."),
        Field(
            "mix_vendors",
            Bool(),
            "Whether one placement across several hosts may take GPUs of different vendors "
            "(false: never; its ranks would run different device runtimes).",
        ),
        Field(
            "container",
            CONTAINER,
            "Run each worker as a container (podman or docker) that sees exactly its GPUs; "
            "see the Containers page.",
        ),
    ),
    description="A job the agent may run; its command comes from here, never from a request.",
)

FALLBACK = Record(
    FallbackRule,
    (
        Field(
            "action",
            Enum("cpu", "wait", "fail"),
            "cpu: run on CPU; wait: run nothing until GPUs return; fail: report the job failed.",
            required=True,
        ),
        Field(
            "threads",
            Int(minimum=1, maximum=MAX_THREADS, why="more CPU threads than any machine has"),
            "CPU threads (OMP_NUM_THREADS, torch.set_num_threads) for action cpu only.",
        ),
    ),
    description="What happens to a job when its GPUs are unavailable.",
    rules=(OnlyWhen("threads", "action", "cpu"),),
)
