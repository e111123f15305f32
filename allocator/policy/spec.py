"""The policy file's field spec: the one source of truth for its format.

The loader reads a file by walking :data:`POLICY`; ``policy_json_schema``
describes the file by asking the same spec for its schema; and
``policy_to_dict`` writes a policy back through it. Defaults come from the
dataclasses of :mod:`allocator.policy.model`.
"""

from __future__ import annotations

from allocator.policy.container_field import CONTAINER
from allocator.policy.history_field import HISTORY, MAX_HISTORY_ENTRIES
from allocator.policy.host_fields import HostList, HostMap
from allocator.policy.idle_rule import IDLE
from allocator.policy.model import (
    FallbackRule,
    HealthSettings,
    Host,
    Job,
    Policy,
    Pool,
    Reservation,
)
from allocator.policy.on_change import OnChange
from allocator.policy.quotas_spec import PRIORITY, QUOTA, TEAM
from allocator.policy.release_on_exit import ReleaseOnExit
from allocator.policy.sharing_field import SharingKind
from allocator.policy.yamlspec.kinds import (
    Bool,
    Const,
    Enum,
    Glob,
    Int,
    Name,
    Number,
    Str,
    Timestamp,
)
from allocator.policy.yamlspec.structures import EnvMap, Field, ListOf, NameMap, OnlyWhen, Record
from allocator.records.fields import MAX_GPU_INDEX

__all__ = [
    "DAY",
    "FALLBACK",
    "HEALTH",
    "HISTORY",
    "HOST",
    "HOUR",
    "JOB",
    "MAX_ARGUMENTS",
    "MAX_ARGUMENT_LENGTH",
    "MAX_ENV_ENTRIES",
    "MAX_GLOBS",
    "MAX_HISTORY_ENTRIES",
    "MAX_HOSTS",
    "MAX_HOST_GPUS",
    "MAX_JOBS",
    "MAX_RESERVATIONS",
    "MAX_RESTARTS",
    "MAX_SMALL_SECTION",
    "MAX_THREADS",
    "MAX_XID",
    "MAX_XID_ITEMS",
    "MIN_HEALTH_INTERVAL",
    "POLICY",
    "POOL",
    "RESERVATION",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIX",
    "SUPPORTED_VERSION",
]

SUPPORTED_VERSION = 1

# Bounds: what hardware has, or more than any sane policy needs. Each stops a
# typo (or a hostile file) from costing memory or time before anything runs.
#: GPUs on one host: the indices every part accepts run 0..MAX_GPU_INDEX.
MAX_HOST_GPUS = MAX_GPU_INDEX + 1
_GPU_LIMIT = f"a host has at most {MAX_HOST_GPUS:,} GPUs, indices 0-{MAX_GPU_INDEX:,}"
MAX_HOSTS = 20_000
MAX_JOBS = 10_000
MAX_RESERVATIONS = 1_000
MAX_SMALL_SECTION = 1_000
MAX_GLOBS = 100
#: Matches what an assignment's ad-hoc command may hold (allocator.records.types).
MAX_ARGUMENTS = 4096
MAX_ARGUMENT_LENGTH = 65_536
MAX_ENV_ENTRIES = 1024
MAX_THREADS = 4096
MAX_RESTARTS = 10_000
MAX_XID = 65_535
MAX_XID_ITEMS = 1024
#: Health checks more often than this only burn the agent's CPU.
MIN_HEALTH_INTERVAL = 0.1
HOUR = 3600.0
DAY = 86_400.0
_ARGUMENT = Str(max_length=MAX_ARGUMENT_LENGTH)

#: Set by the agent from the assignment; a job's ``env`` may not override them
#: (every vendor's device filters and orderings: a second filter would hide the
#: wrong devices, another order or hierarchy would renumber them). The same set as
#: ``allocator.gpus.vendors.VISIBILITY_VARIABLES`` (a test holds them equal).
RESERVED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ZE_AFFINITY_MASK",
    "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
    "ZE_FLAT_DEVICE_HIERARCHY",
    "ONEAPI_DEVICE_SELECTOR",
)
#: The GPU vendors a host or pool may name (those of allocator.gpus.vendors).
_VENDOR = Enum("nvidia", "amd", "intel", "apple")
RESERVED_ENV_PREFIX = "ALLOCATOR_"

HOST = Record(
    Host,
    (
        Field(
            "gpus",
            Int(minimum=0, maximum=MAX_HOST_GPUS, why=_GPU_LIMIT),
            "Number of GPUs on the host (indices 0..gpus-1); used where NVML is "
            "absent and to check reservations.",
            required=True,
        ),
        Field(
            "pool",
            Name("pool"),
            "Pool the host belongs to (the same as listing it in the pool's hosts).",
        ),
        Field(
            "vendor",
            _VENDOR,
            "Whose GPUs the host has (nvidia, amd, intel, apple; the pool's when absent). "
            "The agent detects its vendor; status and doctor report a mismatch.",
        ),
    ),
    description="A host and its declared GPU inventory.",
)

POOL = Record(
    Pool,
    (
        Field(
            "hosts",
            HostList(max_items=MAX_HOSTS),
            "Hosts in this pool, by name or range pattern (node[0000-12499]); each must be "
            "declared under hosts and belong to one pool only.",
        ),
        Field(
            "sharing",
            SharingKind(),
            "exclusive (the default): a GPU serves one job at a time. "
            "{mode: time-slice, slots: N}: up to N jobs per GPU. {mode: mps, slots: N}: up to "
            "N jobs per GPU through one NVIDIA MPS control daemon per GPU, each job limited to "
            "its share of the SMs and memory. shared: deprecated, time-slice without a limit.",
        ),
        Field(
            "max_gpus_per_job",
            Int(minimum=1, maximum=MAX_HOST_GPUS, why=_GPU_LIMIT),
            "Most GPUs one job may hold on one host of this pool (unlimited when absent).",
        ),
        Field("idle", IDLE, "Idle-holder rule for jobs on this pool's hosts."),
        Field("vendor", _VENDOR, "Whose GPUs this pool's hosts have (a host may say its own)."),
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
            ListOf(
                Int(minimum=0, maximum=MAX_GPU_INDEX, why=_GPU_LIMIT),
                min_items=1,
                max_items=MAX_HOST_GPUS,
                unique=True,
                label="GPU",
            ),
            "Reserved GPU indices; each must exist on the host.",
            required=True,
        ),
        Field(
            "for",
            ListOf(Glob(), min_items=1, max_items=MAX_GLOBS, unique=True, label="glob"),
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
            ListOf(_ARGUMENT, min_items=1, max_items=MAX_ARGUMENTS, label="argument"),
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

HEALTH = Record(
    HealthSettings,
    (
        Field(
            "ignored_xids",
            ListOf(
                Int(minimum=0, maximum=MAX_XID),
                unique=True,
                max_items=MAX_XID_ITEMS,
                label="XID",
                collect=frozenset,
            ),
            "XID events caused by applications, not by a failing GPU; they do not mark a GPU bad.",
        ),
        Field(
            "interval_seconds",
            Number(minimum=MIN_HEALTH_INTERVAL, maximum=HOUR, why="an hour"),
            "Seconds between GPU health checks.",
        ),
        Field(
            "recovery_probe",
            ListOf(_ARGUMENT, min_items=1, max_items=MAX_ARGUMENTS, label="argument"),
            "Command the agent runs, with only the recovering GPU visible, before it "
            "returns a GPU to service after NVML reports it healthy again (e.g. a script "
            "that creates a CUDA context); it must exit 0 within the timeout. Unset: "
            "NVML's clean checks alone return the GPU.",
        ),
        Field(
            "recovery_probe_timeout_seconds",
            Number(minimum=1, maximum=HOUR, why="an hour"),
            "Hard time limit of one recovery probe; a probe still running is killed "
            "and counts as a failure.",
        ),
        Field(
            "hold_down_seconds",
            Number(minimum=0, maximum=DAY, why="a day"),
            "How long a GPU that was out of service must stay healthy before jobs return "
            "to it; doubles with each further failure (0: no hold-down).",
        ),
        Field(
            "hold_down_max_seconds",
            Number(minimum=0, maximum=DAY, why="a day"),
            "Cap of the hold-down. A GPU in service this long is stable: its failures are "
            "forgotten, and jobs held back by flap_restart_limit return to it.",
        ),
        Field(
            "flap_restart_limit",
            Int(minimum=0, maximum=MAX_RESTARTS),
            "Restarts of a job caused by its GPUs' health (moving off and back) before it "
            "stays in its fallback (on CPU, or stopped) until the GPUs are stable.",
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
            HostMap(HOST, max_entries=MAX_HOSTS),
            "Hosts by name, with their GPU inventory. A key may be a range pattern "
            "(node[0000-12499], gpu-[1-8], rack[1-2]-n[01-16]) declaring every host it names; "
            "a host written out on its own wins over a range that also covers it.",
            nullable=True,
        ),
        Field(
            "pools",
            NameMap(POOL, "pool", max_entries=MAX_SMALL_SECTION),
            "GPU pools by name.",
            nullable=True,
        ),
        Field(
            "reservations",
            ListOf(RESERVATION, label="reservation", max_items=MAX_RESERVATIONS),
            "GPU reservations.",
            nullable=True,
        ),
        Field("jobs", NameMap(JOB, "job", max_entries=MAX_JOBS), "Jobs by name.", nullable=True),
        Field(
            "fallback",
            NameMap(FALLBACK, "fallback rule", max_entries=MAX_SMALL_SECTION),
            "Fallback rules by name, referenced by jobs.",
            nullable=True,
        ),
        Field(
            "visible_devices",
            Enum("uuid", "index"),
            "How GPUs are named in CUDA_VISIBLE_DEVICES: by UUID (robust) or NVML index.",
        ),
        Field("health", HEALTH, "GPU health monitoring settings."),
        Field("history", HISTORY, "How much assignment history the store keeps."),
        Field(
            "teams",
            NameMap(TEAM, "team", max_entries=MAX_SMALL_SECTION),
            "Teams by name (team:NAME in quotas and priorities).",
            nullable=True,
        ),
        Field(
            "quotas",
            ListOf(QUOTA, label="quota", max_items=MAX_SMALL_SECTION),
            "The most each user, team or unix group may hold at once.",
            nullable=True,
        ),
        Field(
            "priorities",
            ListOf(PRIORITY, label="priority rule", max_items=MAX_SMALL_SECTION),
            "Wait-queue priorities (allocator set --wait).",
            nullable=True,
        ),
    ),
    description="Which hosts, GPU pools, reservations, jobs and fallback rules exist.",
)
