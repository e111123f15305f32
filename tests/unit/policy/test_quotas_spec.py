"""The policy's teams, quotas and priorities: read, and every mistake refused with its line."""

from __future__ import annotations

import textwrap

import pytest

from allocator.policy import load_policy
from allocator.policy.model import PriorityRule, Quota
from tests.unit.policy.test_loader_errors import only_error

HEAD = """
version: 1
hosts:
  node1: {gpus: 4}
pools:
  a100: {hosts: [node1]}
teams:
  team-a: {members: [alice, bob]}
"""


def _load(tail: str) -> object:
    return load_policy(textwrap.dedent(HEAD + tail).lstrip("\n"), "policy.yaml")


def test_quotas_and_priorities_are_read_into_the_model() -> None:
    policy = _load(
        """
quotas:
  - {who: team:team-a, gpus: 8, slots: 16}
  - {who: user:carol, gpus: 2, pools: [a100]}
priorities:
  - {who: [unix:gpu-users], priority: 10}
  - {jobs: ["eval-*"], priority: -5}
"""
    )
    assert policy.teams["team-a"].members == ("alice", "bob")  # type: ignore[attr-defined]
    assert policy.quotas == (  # type: ignore[attr-defined]
        Quota(who="team:team-a", gpus=8, slots=16),
        Quota(who="user:carol", gpus=2, pools=("a100",)),
    )
    assert policy.priorities == (  # type: ignore[attr-defined]
        PriorityRule(priority=10, who=("unix:gpu-users",)),
        PriorityRule(priority=-5, jobs=("eval-*",)),
    )


@pytest.mark.parametrize(
    ("tail", "fragment"),
    [
        ("quotas:\n  - {who: team:nobody, gpus: 1}\n", "unknown team 'nobody'"),
        ("quotas:\n  - {who: user:alice, gpus: 1, pools: [h100]}\n", "unknown pool 'h100'"),
        ("quotas:\n  - {who: user:alice}\n", "a quota needs gpus, slots or both"),
        ("quotas:\n  - {who: group:x, gpus: 1}\n", "must start with user:, team: or unix:"),
        ("quotas:\n  - {who: user:alice, gpus: -1, slots: 1}\n", "quotas[0].gpus"),
        (
            "quotas:\n  - {who: user:alice, gpus: 1}\n  - {who: user:alice, slots: 2}\n",
            "user:alice has two quotas for the same pools",
        ),
        ("priorities:\n  - {priority: 3}\n", "a priority rule needs who, jobs or both"),
        ("priorities:\n  - {who: [team:ghost], priority: 3}\n", "unknown team 'ghost'"),
    ],
)
def test_a_bad_quota_or_priority_is_refused_naming_its_line(tail: str, fragment: str) -> None:
    error = only_error(HEAD + tail)
    assert fragment in str(error), str(error)
    assert "policy.yaml:" in str(error)
