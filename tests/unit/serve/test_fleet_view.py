"""The fleet view behind ``allocator serve``: a one-host change rebuilds that host only,
and every answer equals what a whole rebuild makes."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, PolicyRecord
from allocator.serve.fleet_api import StatusQuery, fleet_json, metrics_text, status_json
from allocator.serve.fleet_view import FleetView
from allocator.serve.mirror import FleetMirror
from allocator.serve.select import select_hosts
from allocator.status.documents import status_document
from allocator.status.join import group_status
from allocator.store import Event, KeyValue, Listing
from tests.support.prometheus import parse_exposition

LAYOUT = KeyLayout("/a")
NOW = datetime(2027, 1, 1, tzinfo=UTC)
POLICY = """version: 1
pools:
  big: {hosts: [n0, n1]}
hosts:
  n0: {gpus: 2}
  n1: {gpus: 2}
  n2: {gpus: 2}
jobs:
  train: {command: [python, -m, train]}
"""


def _policy() -> bytes:
    digest = hashlib.sha256(POLICY.encode()).hexdigest()
    return PolicyRecord(POLICY, digest, "ops", "t").to_json()


def _held(job: str, host: str, gpus: tuple[int, ...], nodes: tuple[str, ...] = ()) -> bytes:
    return Assignment(
        job=job,
        host=host,
        gpus=gpus,
        mode="gpu",
        updated_by="ops",
        updated_at="t",
        nodes=nodes,
        master_port=2345 if nodes else None,
    ).to_json()


def _agent(host: str, unhealthy: dict[int, str] | None = None) -> bytes:
    return AgentRecord(
        host=host, gpus=(GpuInfo(0), GpuInfo(1)), unhealthy=unhealthy or {}
    ).to_json()


def _mirror() -> FleetMirror:
    mirror = FleetMirror(LAYOUT)
    mirror.reset(
        Listing(
            (
                KeyValue(LAYOUT.policy, _policy(), 2, 2),
                KeyValue(LAYOUT.agent("n0"), _agent("n0"), 3, 3, lease=7),
                KeyValue(LAYOUT.assignment("n0", "train"), _held("train", "n0", (0,)), 4, 4),
                KeyValue(
                    LAYOUT.assignment("n1", "wide"), _held("wide", "n1", (1,), ("n1", "n2")), 5, 5
                ),
                KeyValue(
                    LAYOUT.assignment("n2", "wide"), _held("wide", "n2", (0,), ("n1", "n2")), 5, 5
                ),
            ),
            5,
        )
    )
    return mirror


def _full(mirror: FleetMirror) -> tuple[dict[str, object], bytes]:
    """The status document of the whole fleet joined at once, and the metrics of a view
    built from scratch: every host's part made again and the fleet's sums counted anew."""
    hosts, revision = mirror.status(NOW, lambda _bad: None)
    document = json.loads(json.dumps(status_document(hosts, revision, group_status(hosts))))
    items, policy, _ = mirror.snapshot()
    fresh = FleetMirror(LAYOUT)
    fresh.reset(Listing((*items, *([policy] if policy else [])), revision))
    return document, _incremental(FleetView(fresh, lambda _bad: None))[1]


def _incremental(view: FleetView) -> tuple[dict[str, object], bytes]:
    view.update(NOW, 0.0)
    document = json.loads(b"".join(status_json(view, StatusQuery({}), select_hosts)))
    return document, metrics_text(view, True, 0.0)


def _same_metrics(ours: bytes, theirs: bytes) -> None:
    assert parse_exposition(ours.decode()).samples == parse_exposition(theirs.decode()).samples


def test_a_one_host_change_rebuilds_that_host_only_and_answers_as_a_whole_rebuild() -> None:
    mirror = _mirror()
    built: list[str] = []
    view = FleetView(mirror, lambda _bad: None, on_host_built=built.append)
    document, metrics = _incremental(view)
    assert sorted(built) == ["n0", "n1", "n2"]
    assert (document, parse_exposition(metrics.decode()).samples) == (
        _full(mirror)[0],
        parse_exposition(_full(mirror)[1].decode()).samples,
    )

    built.clear()
    mirror.apply(
        [
            Event("put", LAYOUT.agent("n1"), _agent("n1", {0: "XID 79"}), 6),
            Event("delete", LAYOUT.assignment("n0", "train"), None, 6),
        ],
        {LAYOUT.agent("n1"): 9},
    )
    document, metrics = _incremental(view)
    assert sorted(built) == ["n0", "n1"]  # n2 was not touched
    full_document, full_metrics = _full(mirror)
    assert document == full_document
    _same_metrics(metrics, full_metrics)
    scrape = parse_exposition(metrics.decode())
    assert scrape.value("allocator_fleet_agents", state="alive") == 2.0
    assert scrape.value("allocator_fleet_gpus", host="n1", state="unhealthy") == 1.0

    built.clear()
    _incremental(view)
    assert built == []  # nothing changed: nothing rebuilt


def test_the_grid_has_one_cell_per_gpu_unhealthy_winning_and_a_row_per_host() -> None:
    mirror = _mirror()
    mirror.apply([Event("put", LAYOUT.agent("n1"), _agent("n1", {1: "XID"}), 6)], {})
    view = FleetView(mirror, lambda _bad: None)
    view.update(NOW, 0.0)
    grid = json.loads(fleet_json(view, "2027-01-01T00:00:00Z"))
    states = grid["states"]
    assert grid["pools"] == ["big"] and grid["revision"] == 6
    cells = {name: [states[int(c)] for c in cells] for name, _pool, _agent, cells in grid["hosts"]}
    assert cells == {
        "n0": ["held", "free"],
        "n1": ["free", "unhealthy"],  # held by wide, but unhealthy wins
        "n2": ["held", "free"],
    }
    assert [row[1:3] for row in grid["hosts"]] == [[0, "up"], [0, "up"], [-1, "none"]]


def test_a_new_policy_rebuilds_every_host_and_drops_those_it_no_longer_has() -> None:
    mirror = _mirror()
    built: list[str] = []
    view = FleetView(mirror, lambda _bad: None, on_host_built=built.append)
    view.update(NOW, 0.0)
    smaller = POLICY.replace("  n2: {gpus: 2}\n", "").replace("[n0, n1]", "[n0]")
    digest = hashlib.sha256(smaller.encode()).hexdigest()
    record = PolicyRecord(smaller, digest, "ops", "t").to_json()
    mirror.apply(
        [
            Event("put", LAYOUT.policy, record, 6),
            Event("delete", LAYOUT.assignment("n2", "wide"), None, 6),
        ],
        {},
    )
    built.clear()
    view.update(NOW, 0.0)
    assert sorted(built) == ["n0", "n1"] and view.names() == ["n0", "n1"]
    assert (
        view.totals.pools["big"].held == 1 and view.totals.pools[None].held == 1
    )  # n1 left the pool


def test_a_host_that_moves_with_time_alone_is_rebuilt_each_interval_the_others_never() -> None:
    reserved = POLICY + (
        "reservations:\n"
        "  - {name: nightly, host: n2, gpus: [1], for: [eval], until: 2027-01-01T00:01:00Z}\n"
    )
    mirror = _mirror()
    digest = hashlib.sha256(reserved.encode()).hexdigest()
    record = PolicyRecord(reserved, digest, "ops", "t").to_json()
    mirror.apply([Event("put", LAYOUT.policy, record, 6)], {})
    built: list[str] = []
    view = FleetView(mirror, lambda _bad: None, timed_seconds=30.0, on_host_built=built.append)
    view.update(NOW, 100.0)
    assert sorted(built) == ["n0", "n1", "n2"]
    states = json.loads(fleet_json(view, "now"))["states"]

    def n2() -> list[str]:
        return [states[int(c)] for c in view.views["n2"].cells]

    assert n2() == ["held", "reserved"]
    built.clear()
    later = NOW.replace(minute=2)  # the reservation has ended
    view.update(later, 129.0)
    assert built == [] and n2() == ["held", "reserved"]  # not due yet
    view.update(later, 130.0)
    assert built == ["n2"] and n2() == ["held", "free"]
