"""Who may change what another user holds: the holder, a team's operator, the policy's operators."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from allocator.control.client import Allocator
from allocator.control.owners import Standing, check_owner, may_change
from allocator.errors import EXIT_PERMISSION, NotPermitted
from allocator.placement.choose import Request
from allocator.policy.model import Policy, Team
from allocator.records.types import Assignment
from allocator.store import Store
from tests.unit.control.test_across_hosts import policy_text

NOW = datetime(2026, 6, 1, tzinfo=UTC)

POLICY = Policy(
    version=1,
    teams={
        "vision": Team(name="vision", members=("alice", "bob"), operators=("carol",)),
        "infra": Team(name="infra", members=("dave",)),
    },
    operators=("user:ops", "unix:wheel", "team:infra"),
)


@pytest.mark.parametrize(
    ("acting", "groups", "holder", "allowed"),
    [
        ("alice", (), "alice", True),  # the holder
        ("bob", (), "", True),  # a record from before holders: anyone's
        ("bob", (), "alice", False),  # a teammate is not an operator
        ("carol", (), "alice", True),  # the team's operator
        ("carol", (), "erin", False),  # ... of that team's members only
        ("ops", (), "alice", True),  # a policy operator by name
        ("erin", ("wheel",), "alice", True),  # ... by unix group
        ("dave", (), "alice", True),  # ... by team
        ("erin", ("users",), "alice", False),
    ],
)
def test_who_may_change_a_holding(
    acting: str, groups: tuple[str, ...], holder: str, allowed: bool
) -> None:
    assert may_change(POLICY, acting, groups, holder) is allowed


def test_a_refusal_names_the_holding_and_its_holder_on_one_line() -> None:
    with pytest.raises(NotPermitted) as refused:
        check_owner(POLICY, "bob", (), "alice", "job 'train' on node1")
    assert refused.value.exit_code == EXIT_PERMISSION
    text = str(refused.value)
    assert "job 'train' on node1 is held by alice" in text and "\n" not in text


def _as(store: Store, holder: str) -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor=f"{holder}@h", holder=holder)


def test_every_write_of_another_holders_assignment_is_refused(store: Store) -> None:
    alice, bob, ops = _as(store, "alice"), _as(store, "bob"), _as(store, "ops")
    alice.apply_policy(policy_text() + "operators: [user:ops]\n", "p.yaml")
    alice.assign(Request(job="other", host="node0", gpus=(0,)))
    alice.assign_across(Request(job="train", host="", count=1), ["node1", "node2"])
    refusals = [
        lambda: bob.release("node0", "other"),
        lambda: bob.assign(Request(job="other", host="node0", gpus=(1,))),
        lambda: bob.release_across("train"),
        lambda: bob.assign_across(Request(job="train", host="", count=1), ["node1", "node3"]),
    ]
    for refused in refusals:
        with pytest.raises(NotPermitted, match="held by alice"):
            refused()
    assert alice.host("node0").assignments["other"].gpus == (0,)
    assert ops.release_across("train").released == ("node1", "node2")
    assert ops.release("node0", "other")


def test_a_refusal_from_a_kept_view_is_checked_against_the_store(store: Store) -> None:
    alice, bob = _as(store, "alice"), _as(store, "bob")
    alice.apply_policy(policy_text(), "p.yaml")
    bob.assign(Request(job="other", host="node0", gpus=(3,)))
    bob.release("node0", "other")
    alice.assign(Request(job="other", host="node0", gpus=(0,)))
    bob.assign(Request(job="mine", host="node0", gpus=(2,)))  # bob's kept view: alice holds it
    alice.release("node0", "other")
    assert bob.assign(Request(job="other", host="node0", gpus=(1,)))[0].holder == "bob"


def test_standing_refuses_another_holders_assignment() -> None:
    """A plain standing, no store: bob may not change alice's job; acting for the policy may."""
    held = Assignment(
        job="train",
        host="node1",
        gpus=(0,),
        mode="gpu",
        updated_by="a",
        updated_at="t",
        holder="alice",
    )
    with pytest.raises(NotPermitted, match="held by alice"):
        Standing("bob", False, (), (), POLICY).check_owners([None, held])
    Standing("bob", True, (), (), POLICY).check_owners([held])
    Standing("alice", False, (), (), Policy(version=1)).check_owners([held])
    Standing("carol", False, (), (), POLICY).check_owners([held])  # vision's operator
    Standing("bob", False, (), (), POLICY).check_owners([None])
