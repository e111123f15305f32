"""The policy file's field spec: the one source of truth for its format.

The loader reads a file by walking :data:`POLICY`; ``policy_json_schema``
describes the file by asking the same spec for its schema; and
``policy_to_dict`` writes a policy back through it. Defaults come from the
dataclasses of :mod:`allocator.policy.model`.

Each section has a module of its own (``hosts_spec``, ``jobs_spec``,
``health_spec``, ``history_field``, ``quotas_spec``), their bounds are
:mod:`allocator.policy.spec_bounds`; this module puts them together.
"""

from __future__ import annotations

from allocator.policy.fair_share_spec import FAIR_SHARE
from allocator.policy.health_spec import HEALTH
from allocator.policy.history_field import HISTORY
from allocator.policy.host_fields import HostMap
from allocator.policy.hosts_spec import HOST, POOL, RESERVATION
from allocator.policy.jobs_spec import FALLBACK, JOB
from allocator.policy.model import Policy
from allocator.policy.quotas_spec import OPERATORS, PRIORITY, QUOTA, TEAM
from allocator.policy.spec_bounds import MAX_HOSTS, MAX_JOBS, MAX_RESERVATIONS, MAX_SMALL_SECTION
from allocator.policy.yamlspec.kinds import Const, Enum, Name
from allocator.policy.yamlspec.structures import Field, ListOf, NameMap, Record

__all__ = ["POLICY", "SUPPORTED_VERSION"]

SUPPORTED_VERSION = 1

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
        Field(
            "fair_share",
            FAIR_SHARE,
            "Order waiting requests of equal priority by their holders' recent usage "
            "(left out: first come, first served).",
        ),
        Field(
            "operators",
            OPERATORS,
            "Subjects who may change or release anyone's assignments (docs/queue.md).",
            nullable=True,
        ),
        Field(
            "submit_as_root",
            ListOf(Name("user"), unique=True, label="user", max_items=1000),
            "Users whose submitted jobs (allocator submit) an agent running as root may run "
            "as root; anyone else's it runs as that user, never as root (docs/submit.md).",
            nullable=True,
        ),
    ),
    description="Which hosts, GPU pools, reservations, jobs and fallback rules exist.",
)
