"""Who asks: priorities and reservations bind self-service requests to the holder (pure)."""

from __future__ import annotations

from allocator.control.holder import asker_of, priority_of
from allocator.policy.model import Host, Policy, PriorityRule, Reservation, Team

POLICY = Policy(
    version=1,
    hosts={"node1": Host("node1", 4)},
    teams={"infra": Team("infra", ("alice",))},
    priorities=(PriorityRule(5, jobs=("urgent-*",)), PriorityRule(7, who=("team:infra",))),
    reservations=(Reservation("r", "node1", (3,), who=("team:infra", "unix:gpu")),),
)


def test_job_name_priorities_apply_to_operator_requests_only() -> None:
    assert priority_of(POLICY, "bob", (), "urgent-1") == 5
    assert priority_of(POLICY, "bob", (), None) == 0  # self-service: its name gives nothing
    assert priority_of(POLICY, "alice", (), None) == 7  # who asks does


def test_the_asker_is_the_holders_subjects_that_a_reservation_names() -> None:
    assert asker_of(POLICY, "alice", ("gpu", "staff")) == ("team:infra", "unix:gpu")
    assert asker_of(POLICY, "bob", ()) == ()
