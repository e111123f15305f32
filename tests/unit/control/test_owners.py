"""Who may change what another user holds: the holder, a team's operator, the policy's operators."""

from __future__ import annotations

import pytest

from allocator.control.owners import check_owner, may_change
from allocator.errors import EXIT_PERMISSION, NotPermitted
from allocator.policy.model import Policy, Team

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
