"""Reservations hold from their start: set warns, the agent enforces by its clock, status flags."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.types import DesiredJob
from allocator.errors import PlacementRefused
from allocator.placement.choose import Request, place
from allocator.placement.reservations import active_reservations, upcoming_conflicts
from allocator.policy.model import FallbackRule, Host, Job, Policy, Reservation
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.status.join import build_status
from allocator.store import KeyValue

START = datetime(2030, 1, 1, tzinfo=UTC)
UNTIL = datetime(2030, 1, 2, tzinfo=UTC)
BEFORE = START - timedelta(minutes=5)
DURING = START + timedelta(hours=1)
EVAL = Reservation("eval", "node1", (3,), ("eval-*",), start=START, until=UNTIL)


def policy(fallback: str | None = "cpu-2") -> Policy:
    rules = {"cpu-2": FallbackRule("cpu-2", "cpu", threads=2), "wait": FallbackRule("wait", "wait")}
    return Policy(
        version=1,
        hosts={"node1": Host("node1", 4)},
        reservations=(EVAL,),
        jobs={
            "train": Job("train", ("python", "train.py"), fallback=fallback),
            "eval-nightly": Job("eval-nightly", ("python", "eval.py")),
        },
        fallback=rules,
    )


def held(job: str, *gpus: int) -> Assignment:
    return Assignment(
        job=job, host="node1", gpus=gpus, mode="gpu", updated_by="ops@x", updated_at="t"
    )


# --- set ------------------------------------------------------------------------


def test_taking_a_gpu_whose_reservation_starts_later_is_allowed_with_a_warning() -> None:
    placement = place(policy(), Request("train", "node1", gpus=(2, 3)), {}, BEFORE)
    assert placement.gpus == (2, 3)
    assert placement.notes == (
        "GPU 3 on node1 is reserved by 'eval' for eval-* until 2030-01-02T00:00:00Z from "
        "2030-01-01T00:00:00Z; job 'train' loses it then (its fallback rule applies)",
    )


def test_a_job_the_reservation_admits_gets_no_warning() -> None:
    placement = place(policy(), Request("eval-nightly", "node1", gpus=(3,)), {}, BEFORE)
    assert placement.notes == ()


def test_count_n_keeps_clear_of_gpus_a_reservation_will_take() -> None:
    placement = place(policy(), Request("train", "node1", count=3), {}, BEFORE)
    assert placement.gpus == (0, 1, 2) and placement.notes == ()
    forced = place(policy(), Request("train", "node1", count=4), {}, BEFORE)
    assert forced.gpus == (0, 1, 2, 3) and len(forced.notes) == 1


# --- the agent, by its own clock ------------------------------------------------------


def want(p: Policy, assignment: Assignment, now: datetime | None) -> DesiredJob:
    return desired_jobs(
        DesiredInputs(p, "node1", {assignment.job: assignment}, {}, None, {}, {}, now)
    )[assignment.job]


def test_at_the_window_start_a_holder_it_does_not_cover_falls_back_with_the_reason() -> None:
    train = held("train", 2, 3)
    assert want(policy(), train, BEFORE).device == "cuda"
    during = want(policy(), train, DURING)
    assert (during.state, during.device) == ("run", "cpu")
    assert during.fallback_reason == (
        "GPU 3 reserved by 'eval' for eval-* until 2030-01-02T00:00:00Z"
    )
    env = during.workers[0].env
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["ALLOCATOR_DEVICE"] == "cpu"
    assert "reserved by 'eval'" in env["ALLOCATOR_FALLBACK_REASON"]
    assert want(policy(), train, UNTIL).device == "cuda"  # the window is over


def test_a_holder_without_a_fallback_rule_waits_instead_of_breaking_the_reservation() -> None:
    during = want(policy(fallback=None), held("train", 3), DURING)
    assert (during.state, during.workers) == ("wait", ())
    assert during.message.endswith("job 'train' has no fallback rule, so it waits")


def test_a_job_the_reservation_admits_keeps_running() -> None:
    assert want(policy(), held("eval-nightly", 3), DURING).device == "cuda"


def test_a_client_clock_in_the_future_does_not_get_past_the_agent() -> None:
    # the operator's laptop said 2031, after the window; the agent's clock says it is open
    laptop = UNTIL + timedelta(days=365)
    taken = place(policy(), Request("train", "node1", gpus=(3,)), {}, laptop)
    assert taken.gpus == (3,)
    assert want(policy(), held("train", 3), DURING).device == "cpu"


def test_the_agent_recomputes_when_a_window_opens_or_closes() -> None:
    assert active_reservations(policy(), "node1", BEFORE) == ()
    assert active_reservations(policy(), "node1", DURING) == ("eval",)
    assert active_reservations(policy(), "node1", UNTIL) == ()


# --- status, diff and apply ----------------------------------------------------------


def test_status_flags_a_holder_inside_a_window_it_is_not_part_of() -> None:
    layout = KeyLayout("/a")
    items = [
        KeyValue(layout.assignment("node1", a.job), a.to_json(), 1, 1)
        for a in (held("train", 3), held("eval-nightly", 2))
    ]
    (node1,) = build_status(policy(), items, layout, DURING)
    rows = {row.gpu: row for row in node1.gpus}
    assert rows["3"].outside_reservation == "'train' is not in reservation 'eval'"
    assert rows["3"].reserved == (
        "eval (eval-*): HELD OUTSIDE IT ('train' is not in reservation 'eval')"
    )
    assert rows["2"].outside_reservation is None
    (before,) = build_status(policy(), items, layout, BEFORE)
    assert all(row.outside_reservation is None for row in before.gpus)


def test_upcoming_conflicts_name_each_held_gpu_a_window_will_take() -> None:
    found = upcoming_conflicts(policy(), "node1", {"train": (2, 3), "eval-nightly": (1,)}, BEFORE)
    assert found == [
        "train@node1: GPU 3 is reserved by 'eval' for eval-* until 2030-01-02T00:00:00Z "
        "from 2030-01-01T00:00:00Z"
    ]


def test_a_self_service_request_is_admitted_by_who_asks_never_by_its_job_name() -> None:
    kept = Reservation("mine", "node1", (2,), ("eval-*",), who=("team:infra",))
    assert kept.admits("eval-x")  # an operator's set: by name
    assert not kept.admits("eval-x", ("user:bob",), self_service=True)  # a run named after it
    assert kept.admits("anything", ("team:infra",), self_service=True)  # who asks
    with_who = Policy(version=1, hosts={"node1": Host("node1", 4)}, reservations=(kept,))
    run = Request(job="eval-x", host="node1", gpus=(2,), self_service=True)
    with pytest.raises(PlacementRefused, match="reserved by 'mine'"):
        place(with_who, run, {}, DURING)
    mine = Request(job="x", host="node1", gpus=(2,), asker=("team:infra",), self_service=True)
    assert place(with_who, mine, {}, DURING).gpus == (2,)


def test_the_agent_and_status_judge_a_holding_by_who_asked_for_it() -> None:
    from msgspec.structs import replace

    from allocator.records.types import RunHolder

    kept = Reservation(
        "eval", "node1", (3,), ("eval-*",), start=START, until=UNTIL, who=("team:x",)
    )
    p = replace(policy(), reservations=(kept,))
    theirs = replace(held("train", 3), asker=("team:x",))  # set by someone the window keeps
    assert want(p, theirs, DURING).device == "cuda"
    run = replace(held("eval-mine", 3), run=RunHolder(pid=1), holder="bob")  # named after it
    layout = KeyLayout("/a")
    items = [KeyValue(layout.assignment("node1", a.job), a.to_json(), 1, 1) for a in (run,)]
    (node1,) = build_status(p, items, layout, DURING)
    assert {r.gpu: r.outside_reservation for r in node1.gpus}["3"] == (
        "'eval-mine' is not in reservation 'eval'"
    )
