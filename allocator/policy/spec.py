"""The policy file's field spec: the one source of truth for its format.

The loader reads a file by walking :data:`POLICY`; ``policy_json_schema``
describes the file by asking the same spec for its schema; and
``policy_to_dict`` writes a policy back through it. Defaults come from the
dataclasses of :mod:`allocator.policy.model`.
"""

from __future__ import annotations

from allocator.policy.kinds import (
    Bool,
    Const,
    Enum,
    Glob,
    Int,
    Name,
    Number,
    OnChange,
    Str,
    Timestamp,
)
from allocator.policy.model import (
    FallbackRule,
    HealthSettings,
    Host,
    Job,
    Policy,
    Pool,
    Reservation,
)
from allocator.policy.structures import EnvMap, Field, ListOf, NameMap, OnlyWhen, Record

__all__ = [
    "FALLBACK",
    "HEALTH",
    "HOST",
    "JOB",
    "POLICY",
    "POOL",
    "RESERVATION",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIX",
    "SUPPORTED_VERSION",
]

SUPPORTED_VERSION = 1

#: Set by the agent from the assignment; a job's ``env`` may not override them.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
RESERVED_ENV_PREFIX = "ALLOCATOR_"

HOST = Record(
    Host,
    (
        Field(
            "gpus",
            Int(minimum=0),
            "Number of GPUs on the host (indices 0..gpus-1); used where NVML is "
            "absent and to check reservations.",
            required=True,
        ),
        Field(
            "pool",
            Name("pool"),
            "Pool the host belongs to (the same as listing it in the pool's hosts).",
        ),
    ),
    description="A host and its declared GPU inventory.",
)

POOL = Record(
    Pool,
    (
        Field(
            "hosts",
            ListOf(Name("host"), unique=True, label="host"),
            "Hosts in this pool; each must be declared under hosts and belong to one pool only.",
        ),
        Field(
            "sharing",
            Enum("exclusive", "shared"),
            "exclusive: a GPU serves one job at a time; shared: several jobs may share a GPU.",
        ),
        Field(
            "max_gpus_per_job",
            Int(minimum=1),
            "Most GPUs one job may hold on one host of this pool (unlimited when absent).",
        ),
    ),
    description="A group of hosts sharing placement rules.",
)

RESERVATION = Record(
    Reservation,
    (
        Field("name", Name("reservation"), "Unique name of the reservation.", required=True),
        Field("host", Name("host"), "Host whose GPUs are reserved.", required=True),
        Field(
            "gpus",
            ListOf(Int(minimum=0), min_items=1, unique=True, label="GPU"),
            "Reserved GPU indices; each must exist on the host.",
            required=True,
        ),
        Field(
            "for",
            ListOf(Glob(), min_items=1, unique=True, label="glob"),
            "Job-name globs (fnmatch, case-sensitive) that may use the reserved GPUs.",
            required=True,
            attr="for_jobs",
        ),
        Field(
            "start",
            Timestamp(),
            "When the reservation begins (inclusive); always when absent. Needs a timezone.",
        ),
        Field(
            "until",
            Timestamp(),
            "When the reservation ends (exclusive); never when absent. Needs a timezone.",
        ),
    ),
    description=(
        "GPUs on one host kept for matching jobs during a window. Reservations of "
        "the same GPU must not overlap in time."
    ),
)

JOB = Record(
    Job,
    (
        Field(
            "command",
            ListOf(Str(), min_items=1, label="argument"),
            "Program and arguments a worker runs (no shell).",
            required=True,
        ),
        Field(
            "env",
            EnvMap(Str(nonempty=False), RESERVED_ENV, RESERVED_ENV_PREFIX),
            "Extra environment variables for the workers (CUDA_VISIBLE_DEVICES, "
            "NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and ALLOCATOR_* are set by the agent).",
        ),
        Field("cwd", Str(), "Working directory of the workers."),
        Field(
            "workers",
            Enum("single", "per-gpu"),
            "single: one worker sees all assigned GPUs; per-gpu: one worker per GPU.",
        ),
        Field(
            "on_change",
            OnChange(),
            "What a change of assignment does: restart the workers, nothing (none), "
            "or send a signal (signal:SIGHUP).",
        ),
        Field(
            "grace_seconds",
            Number(minimum=0),
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
            Int(minimum=0),
            "Crash restarts allowed before the worker is left stopped.",
        ),
        Field(
            "restart_backoff_seconds",
            Number(minimum=0),
            "First delay before restarting a crashed worker; doubles on each crash.",
        ),
        Field(
            "restart_backoff_max_seconds",
            Number(minimum=0),
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
            Int(minimum=1),
            "CPU threads (OMP_NUM_THREADS, torch.set_num_threads) for action cpu only.",
        ),
    ),
    description="What happens to a job when its GPUs are unavailable.",
    rules=(OnlyWhen("threads", "action", "cpu"),),
)

HEALTH = Record(
    HealthSettings,
    (
        Field(
            "ignored_xids",
            ListOf(Int(minimum=0), unique=True, label="XID", collect=frozenset),
            "XID events caused by applications, not by a failing GPU; they do not mark a GPU bad.",
        ),
        Field(
            "interval_seconds",
            Number(above=0),
            "Seconds between GPU health checks.",
        ),
        Field(
            "recovery_probe",
            ListOf(Str(), min_items=1, label="argument"),
            "Command the agent runs, with only the recovering GPU visible, before it "
            "returns a GPU to service after NVML reports it healthy again (e.g. a script "
            "that creates a CUDA context); it must exit 0 within the timeout. Unset: "
            "NVML's clean checks alone return the GPU.",
        ),
        Field(
            "recovery_probe_timeout_seconds",
            Number(above=0),
            "Hard time limit of one recovery probe; a probe still running is killed "
            "and counts as a failure.",
        ),
    ),
    description="GPU health monitoring.",
)

POLICY = Record(
    Policy,
    (
        Field(
            "version",
            Const(SUPPORTED_VERSION),
            "Format version of this file.",
            required=True,
        ),
        Field(
            "hosts",
            NameMap(HOST, "host"),
            "Hosts by name, with their GPU inventory.",
            nullable=True,
        ),
        Field("pools", NameMap(POOL, "pool"), "GPU pools by name.", nullable=True),
        Field(
            "reservations",
            ListOf(RESERVATION, label="reservation"),
            "GPU reservations.",
            nullable=True,
        ),
        Field("jobs", NameMap(JOB, "job"), "Jobs by name.", nullable=True),
        Field(
            "fallback",
            NameMap(FALLBACK, "fallback rule"),
            "Fallback rules by name, referenced by jobs.",
            nullable=True,
        ),
        Field(
            "visible_devices",
            Enum("uuid", "index"),
            "How GPUs are named in CUDA_VISIBLE_DEVICES: by UUID (robust) or NVML index.",
        ),
        Field("health", HEALTH, "GPU health monitoring settings."),
    ),
    description="Which hosts, GPU pools, reservations, jobs and fallback rules exist.",
)
