"""The policy's self-service sections: ``teams``, ``quotas`` and ``priorities``.

A quota or priority names its subject as ``user:NAME``, ``team:NAME`` (a
team of this policy) or ``unix:GROUP`` (a group of the machine the request
is made on). What the sections mean at write time is
:mod:`allocator.control.quotas` and :mod:`allocator.recipes.queue.order`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from allocator.policy.model import PriorityRule, Quota, Team
from allocator.policy.yamlspec.kinds import Glob, Int, Name, Str, name_problem
from allocator.policy.yamlspec.reader import Reader
from allocator.policy.yamlspec.structures import Field, ListOf, Record

if TYPE_CHECKING:
    from yaml.nodes import Node

__all__ = [
    "MAX_QUOTA",
    "OPERATORS",
    "PRIORITY",
    "QUOTA",
    "SUBJECT_KINDS",
    "TEAM",
    "check_quotas",
]

#: More GPUs (or slots) than one holder could ever hold: a typo's bound.
MAX_QUOTA = 1_000_000
SUBJECT_KINDS = ("user", "team", "unix")


class Subject(Str):
    """``user:NAME``, ``team:NAME`` or ``unix:GROUP``."""

    expected = "a subject (user:NAME, team:NAME or unix:GROUP)"

    def problem(self, value: Any, node: Node) -> str | None:
        """Refuse anything but a known kind and a valid name."""
        found = super().problem(value, node)
        if found is not None:
            return found
        kind, _, name = str(value).partition(":")
        if kind not in SUBJECT_KINDS:
            return f"{value!r} must start with user:, team: or unix:"
        return name_problem(name, kind)

    def schema(self) -> dict[str, Any]:
        """A string ``kind:name``."""
        return {"type": "string", "pattern": "^(user|team|unix):[A-Za-z0-9._-]+$"}


_SUBJECTS = ListOf(Subject(), min_items=1, max_items=1000, unique=True, label="subject")
#: The policy's ``operators``: who may change or release anyone's assignments.
OPERATORS = ListOf(Subject(), max_items=1000, unique=True, label="subject")

TEAM = Record(
    Team,
    (
        Field(
            "members",
            ListOf(Name("user"), unique=True, label="member", max_items=10_000),
            "User names of the team's members (the holder names of their requests).",
        ),
        Field(
            "operators",
            ListOf(Name("user"), unique=True, label="operator", max_items=1000),
            "Users who may change or release what the team's members hold.",
        ),
    ),
    description="A named group of users (team:NAME in quotas and priorities).",
)

QUOTA = Record(
    Quota,
    (
        Field("who", Subject(), "user:NAME, team:NAME or unix:GROUP.", required=True),
        Field(
            "gpus",
            Int(minimum=0, maximum=MAX_QUOTA),
            "Most GPUs the subject may hold whole at once (unlimited when absent).",
        ),
        Field(
            "slots",
            Int(minimum=0, maximum=MAX_QUOTA),
            "Most slots of shared GPUs the subject may hold at once (unlimited when absent).",
        ),
        Field(
            "pools",
            ListOf(Name("pool"), unique=True, label="pool", max_items=1000),
            "Count only what is held in these pools (every pool when absent).",
        ),
    ),
    description="The most one user, team or unix group may hold at once.",
)

PRIORITY = Record(
    PriorityRule,
    (
        Field(
            "priority",
            Int(minimum=-1000, maximum=1000),
            "Wait-queue priority: a higher one is served first (0 when no rule matches).",
            required=True,
        ),
        Field("who", _SUBJECTS, "Subjects whose requests get this priority."),
        Field(
            "jobs",
            ListOf(Glob(), min_items=1, max_items=100, unique=True, label="glob"),
            "Job-name globs whose requests get this priority.",
        ),
    ),
    description="The wait-queue priority of some requests (the highest matching rule wins).",
)


def check_quotas(values: dict[str, Any], r: Reader) -> None:
    """Report quotas, priorities and reservations naming unknown teams or pools, or no one."""
    teams = set(r.declared.get("teams", []))
    pools = set(r.declared.get("pools", []))
    seen: dict[tuple[str, tuple[str, ...]], int] = {}
    for index, quota in enumerate(values.get("quotas", ())):
        path = r.item_path("quotas", index)
        _check_subject(quota.who, teams, path, r)
        for pool in quota.pools:
            if pool not in pools:
                r.error_on(path, f"unknown pool {pool!r} (declared: {_names(pools)})")
        if quota.gpus is None and quota.slots is None:
            r.error_on(path, "a quota needs gpus, slots or both")
        key = (quota.who, tuple(sorted(quota.pools)))
        if key in seen:
            r.error_on(path, f"{quota.who} has two quotas for the same pools (quotas[{seen[key]}])")
        seen.setdefault(key, index)
    for index, rule in enumerate(values.get("priorities", ())):
        path = r.item_path("priorities", index)
        for who in rule.who:
            _check_subject(who, teams, path, r)
        if not rule.who and not rule.jobs:
            r.error_on(path, "a priority rule needs who, jobs or both")
    for index, reservation in enumerate(values.get("reservations", ())):
        path = r.item_path("reservations", index)
        for who in reservation.who:
            _check_subject(who, teams, path, r)
        refused = any((e.field or "").startswith(f"{path}.for") for e in r.errors)
        if not reservation.who and not reservation.for_jobs and not refused:  # else reported
            r.error_on(path, "a reservation needs for, who or both")
    for who in values.get("operators", ()):
        _check_subject(who, teams, "operators", r)


def _check_subject(who: str, teams: set[str], path: str, r: Reader) -> None:
    kind, _, name = who.partition(":")
    if kind == "team" and name not in teams:
        r.error_on(path, f"unknown team {name!r} (declared: {_names(teams)})")


def _names(names: set[str]) -> str:
    return ", ".join(sorted(names)) if names else "none"
