"""DesiredInputs: what desired_jobs reads is one value, and that value is the cache key."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from allocator.agent.planning.across_hosts import PeerHost
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.types import Pin
from tests.unit.agent.planning.test_desired import HOST, INVENTORY, assigned, policy

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def base() -> DesiredInputs:
    """Inputs with a value in every field, so that each can be changed."""
    return DesiredInputs(
        policy(),
        HOST,
        {"train": assigned()},
        {"train": 5},
        INVENTORY,
        {3: "XID 79"},
        {"old": 2},
        NOW,
        policy_sha="sha-1",
        reservations=("maintenance",),
        holders={"train": (1, 2)},
        pinned={"train": Pin({1: "XID 79"}, "flapped")},
        ports={"train": 29500},
        master_addr="10.0.0.7",
        peers={"node8": PeerHost("node8")},
        address="10.0.0.7",
        allowed_cpus=frozenset({0, 1}),
        mps_dir="/state/mps",
    )


# One different value per field. A field added to DesiredInputs fails the test below
# until it is listed here, so no input can be left out of the key unnoticed.
CHANGED: dict[str, Any] = {
    "policy": policy(),  # a new policy comes with a new policy_sha, which is the key
    "host": "node9",
    "assignments": {"train": assigned(gpus=(3,))},
    "assignment_revisions": {"train": 6},
    "inventory": INVENTORY[:2],
    "unhealthy": {},
    "failed": {},
    "now": datetime(2025, 6, 1, 12, 1, tzinfo=UTC),  # the key holds what it decides
    "policy_sha": "sha-2",
    "reservations": (),
    "holders": {"train": (1,)},
    "pinned": {},
    "ports": {"train": 29501},
    "master_addr": "10.0.0.8",
    "peers": {"node8": PeerHost("node8", readable=False)},
    "address": "10.0.0.9",
    "allowed_cpus": frozenset({0}),
    "mps_dir": "/elsewhere",
    "vendor": "amd",
    "host_named": False,
}
# Stand-ins: the key compares the policy by its sha and the clock by the reservations.
STOOD_IN = {"policy": "policy_sha", "now": "reservations"}


def test_every_field_is_listed_here() -> None:
    assert {f.name for f in dataclasses.fields(DesiredInputs)} == CHANGED.keys()


def test_changing_any_field_changes_the_key() -> None:
    before = base()
    for name, value in CHANGED.items():
        after = dataclasses.replace(before, **{name: value})
        if name in STOOD_IN:
            assert after == before, name
            stand_in = STOOD_IN[name]
            moved = dataclasses.replace(after, **{stand_in: CHANGED[stand_in]})
            assert moved != before, stand_in
        else:
            assert after != before, name


def test_equal_inputs_hash_alike_and_serve_as_a_dict_key() -> None:
    cache = {base(): "computed"}
    assert cache[base()] == "computed"
    assert hash(dataclasses.replace(base(), policy_sha="sha-2")) != hash(base())


def test_the_value_keeps_what_it_was_made_from_when_the_callers_dicts_change() -> None:
    failed: dict[str, int] = {}
    inputs = DesiredInputs(policy(), HOST, {"train": assigned()}, {}, INVENTORY, {}, failed)
    failed["train"] = 0  # the agent marks a job failed in its own dict afterwards
    assert inputs.failed == {}
    assert inputs != DesiredInputs(policy(), HOST, {"train": assigned()}, {}, INVENTORY, {}, failed)


def test_the_inputs_decide_the_result() -> None:
    inputs = DesiredInputs(policy(), HOST, {"train": assigned()}, {"train": 5}, INVENTORY, {}, {})
    running = desired_jobs(inputs)["train"]
    assert running.state == "run" and running.assignment_revision == 5
    failed = desired_jobs(dataclasses.replace(inputs, failed={"train": 5}))["train"]
    assert failed.state == "failed"
    elsewhere = desired_jobs(dataclasses.replace(inputs, host="node9"))
    assert elsewhere == {}
