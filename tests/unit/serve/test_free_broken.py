"""Where the free GPUs are and what is broken: small answers from the fleet view, whatever
the fleet's size, that agree with the grid and keep since when each thing broke."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from allocator.errors import InvalidInput
from allocator.serve.fleet_view import FleetView
from allocator.serve.free import broken_answer, free_answer
from allocator.serve.mirror import FleetMirror
from allocator.store import Event
from tests.unit.serve.test_fleet_view import LAYOUT, NOW, _agent, _mirror


def _view() -> tuple[FleetView, FleetMirror]:
    mirror = _mirror()
    view = FleetView(mirror, lambda _bad: None)
    view.update(NOW, 0.0)
    return view, mirror


def test_free_hosts_are_counted_from_the_grid_most_free_first_of_the_pool_asked() -> None:
    view, _ = _view()
    # n0: train holds GPU 0; n1: wide holds GPU 1; n2 (no pool): wide holds GPU 0.
    whole = json.loads(free_answer(view, {}))
    assert whole["free"] == 3 and whole["gpus"] == 6 and whole["hosts_total"] == 3
    assert [(h["host"], h["pool"], h["free"], h["total"]) for h in whole["hosts"]] == [
        ("n0", "big", 1, 2),
        ("n1", "big", 1, 2),
        ("n2", None, 1, 2),
    ]
    big = json.loads(free_answer(view, {"pool": "big", "limit": "1"}))
    assert [h["host"] for h in big["hosts"]] == ["n0"]
    assert big["hosts_total"] == 2 and big["free"] == 2 and big["gpus"] == 4


def test_free_hosts_follow_a_change_and_refuse_an_unknown_pool_or_parameter() -> None:
    view, mirror = _view()
    mirror.apply([Event("delete", LAYOUT.assignment("n0", "train"), None, 6)], {})
    view.update(NOW, 0.0)
    first = json.loads(free_answer(view, {"pool": "big"}))["hosts"][0]
    assert (first["host"], first["free"]) == ("n0", 2)
    for query in ({"pool": "nope"}, {"limit": "0"}, {"limit": "x"}, {"host": "n0"}):
        with pytest.raises(InvalidInput):
            free_answer(view, query)


def test_an_unhealthy_gpu_and_a_down_agent_are_listed_with_reason_and_first_sighting() -> None:
    view, mirror = _view()
    first = json.loads(broken_answer(view, {}))
    assert first["gpus"] == [] and first["since_serve_started"] == "2027-01-01T00:00:00Z"
    assert [(a["host"], a["state"], a["since"]) for a in first["agents"]] == [
        ("n1", "none", "2027-01-01T00:00:00Z"),  # no agent ever reported, seen at the first read
        ("n2", "none", "2027-01-01T00:00:00Z"),
    ]
    later = NOW + timedelta(minutes=5)
    mirror.apply(
        [
            Event("put", LAYOUT.agent("n1"), _agent("n1", {0: "Xid 79"}), 6),
            Event("put", LAYOUT.agent("n2"), _agent("n2"), 6),  # a record without a lease
        ],
        {LAYOUT.agent("n1"): 9},
    )
    view.update(later, 0.0)
    broken = json.loads(broken_answer(view, {}))
    assert broken["gpus"] == [
        {
            "host": "n1",
            "pool": "big",
            "gpu": "0",
            "reason": "Xid 79",
            "since": "2027-01-01T00:05:00Z",
        }
    ]
    assert broken["gpus_total"] == 1 and broken["agents_total"] == 1
    assert [(a["host"], a["state"], a["since"]) for a in broken["agents"]] == [
        ("n2", "unleased", "2027-01-01T00:05:00Z")
    ]
    # Rebuilt later with the GPU still unhealthy: still since its first sighting.
    mirror.apply(
        [Event("put", LAYOUT.agent("n1"), _agent("n1", {0: "Xid 79", 1: "Xid 48"}), 7)],
        {LAYOUT.agent("n1"): 9},
    )
    view.update(later + timedelta(minutes=5), 0.0)
    broken = json.loads(broken_answer(view, {"limit": "1"}))
    assert broken["gpus_total"] == 2
    assert [(g["gpu"], g["since"]) for g in broken["gpus"]] == [("0", "2027-01-01T00:05:00Z")]
    # Healthy again: off the list.
    mirror.apply([Event("put", LAYOUT.agent("n1"), _agent("n1"), 8)], {LAYOUT.agent("n1"): 9})
    view.update(later + timedelta(minutes=6), 0.0)
    assert json.loads(broken_answer(view, {}))["gpus_total"] == 0
