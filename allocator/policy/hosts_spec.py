"""The policy's hardware sections: ``hosts``, ``pools`` and ``reservations``."""

from __future__ import annotations

from allocator.gpus.vendors.base import VENDOR_NAMES
from allocator.policy.host_fields import HostList
from allocator.policy.idle_rule import IDLE, Duration
from allocator.policy.model import Host, Pool, Reservation
from allocator.policy.quotas_spec import Subject
from allocator.policy.sharing_field import SharingKind
from allocator.policy.spec_bounds import GPU_LIMIT, MAX_GLOBS, MAX_HOST_GPUS, MAX_HOSTS
from allocator.policy.yamlspec.kinds import Enum, Glob, Int, Name, Timestamp
from allocator.policy.yamlspec.structures import Field, ListOf, Record
from allocator.records.fields import MAX_GPU_INDEX

__all__ = ["HOST", "POOL", "RESERVATION"]

#: The GPU vendors a host or pool may name.
_VENDOR = Enum(*VENDOR_NAMES)
_CDI_NAMES = Enum("card", "pci")
_CDI_NAMES_HELP = (
    "How the host's CDI spec names Intel GPUs, for container jobs: card (card<N>, the "
    "default of Intel's device plugins' generator) or pci (0000-03-00-0-0x56c0, the default "
    "of Intel's DRA driver). Other vendors have one naming."
)

#: A job's time limit: at least a second, at most a year.
_TIME_LIMIT = Duration(minimum=1.0, maximum=365 * 86400.0)

HOST = Record(
    Host,
    (
        Field(
            "gpus",
            Int(minimum=0, maximum=MAX_HOST_GPUS, why=GPU_LIMIT),
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
        Field("cdi_names", _CDI_NAMES, _CDI_NAMES_HELP + " The pool's when absent."),
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
            Int(minimum=1, maximum=MAX_HOST_GPUS, why=GPU_LIMIT),
            "Most GPUs one job may hold on one host of this pool (unlimited when absent).",
        ),
        Field("idle", IDLE, "Idle-holder rule for jobs on this pool's hosts."),
        Field("vendor", _VENDOR, "Whose GPUs this pool's hosts have (a host may say its own)."),
        Field("cdi_names", _CDI_NAMES, _CDI_NAMES_HELP + " A host may say its own."),
        Field(
            "default_time",
            _TIME_LIMIT,
            "Time limit of a job on this pool that asks for none (time=): at its end the job "
            "is stopped and its GPUs released. No limit when absent.",
        ),
        Field(
            "max_time",
            _TIME_LIMIT,
            "Most time a job on this pool may ask for with time=; a request above it is "
            "refused. Unlimited when absent.",
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
            ListOf(
                Int(minimum=0, maximum=MAX_GPU_INDEX, why=GPU_LIMIT),
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
            ListOf(Glob(), min_items=0, max_items=MAX_GLOBS, unique=True, label="glob"),
            "Job-name globs (fnmatch, case-sensitive) whose operator-set jobs may use the "
            "reserved GPUs (never a self-service run or lease, whose job name its asker picks).",
            attr="for_jobs",
        ),
        Field(
            "who",
            ListOf(Subject(), min_items=0, max_items=1000, unique=True, label="subject"),
            "Subjects (user:NAME, team:NAME, unix:GROUP) whose requests, self-service "
            "included, may use the reserved GPUs.",
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
