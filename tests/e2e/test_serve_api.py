"""``allocator serve``'s fleet API for real: the grid, a host, pages of status, the series.

A real ``allocator serve`` process reads a real etcd that the CLI writes
to (the example policy: node1 4 GPUs in pool default, one reserved; node2
8 in a100; node3 2 in inference).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from allocator.records.host_counts import HostCounts
from allocator.records.keys import KeyLayout
from allocator.store import open_store
from tests.e2e.conftest import REPO
from tests.e2e.test_serve import Served
from tests.support.waiting import wait_for


@pytest.fixture
def etcd_served(etcd_server: Any, prefix: str, tmp_path: Path) -> Iterator[Served]:
    extra = ("--sample-seconds", "0.2", "--series-points", "3")
    world = Served(str(etcd_server.url), prefix, tmp_path, *extra)
    try:
        yield world
    finally:
        world.close()


def _json(world: Served, path: str, status: int = 200) -> Any:
    code, body, headers = world.get(path)
    assert code == status, (path, code, body)
    assert headers["content-type"].startswith("application/json")
    return json.loads(body)


def _cells(world: Served) -> dict[str, tuple[str, int, str, list[str]]]:
    grid = _json(world, "/api/v1/fleet")
    states, pools = grid["states"], grid["pools"]
    return {
        name: (pools[pool] if pool >= 0 else "", pool, agent, [states[int(c)] for c in cells])
        for name, pool, agent, cells in grid["hosts"]
    }


def test_the_grid_and_a_host_follow_a_set_and_an_unknown_host_is_not_found(
    etcd_served: Served,
) -> None:
    world = etcd_served
    cells = _cells(world)
    assert list(cells) == ["node1", "node2", "node3"]  # by name
    assert cells["node1"] == ("default", 1, "none", ["free", "free", "free", "reserved"])
    assert cells["node2"][:3] == ("a100", 0, "none") and cells["node2"][3] == ["free"] * 8
    assert world.cli("set", "job=train", "gpus=2", "host=node2").code == 0
    wait_for(
        "the grid to show the set",
        lambda: _cells(world)["node2"][3][1:4] == ["free", "held", "free"],
    )

    printed = json.loads(world.cli("status", "host=node2", "-o", "json").out)
    answered = _json(world, "/api/v1/hosts/node2")
    assert 0 < answered.pop("revision") <= printed.pop("revision") and answered == printed

    missing = _json(world, "/api/v1/hosts/nosuch", 404)
    assert missing["exit_code"] == 6 and "nosuch" in missing["message"]
    assert "\n" not in missing["message"]


def test_status_pages_by_host_and_refuses_bad_parameters_in_one_line(etcd_served: Served) -> None:
    world = etcd_served
    whole = _json(world, "/api/v1/status")
    assert "page" not in whole and len(whole["hosts"]) == 3  # no parameter: as before

    first = _json(world, "/api/v1/status?per_page=2")
    schema = json.loads((REPO / "docs" / "schemas" / "status.schema.json").read_text())
    Draft202012Validator(schema).validate(first)
    assert first["page"] == {"number": 1, "per_page": 2, "hosts": 3, "pages": 2}
    assert [h["host"] for h in first["hosts"]] == ["node1", "node2"]
    last = _json(world, "/api/v1/status?per_page=2&page=2")
    assert [h["host"] for h in last["hosts"]] == ["node3"]
    default = _json(world, "/api/v1/status?page=1")
    assert default["page"] == {"number": 1, "per_page": 100, "hosts": 3, "pages": 1}
    assert default["hosts"] == whole["hosts"]
    a100 = _json(world, "/api/v1/status?pool=a100")
    assert [h["host"] for h in a100["hosts"]] == ["node2"] and a100["page"]["hosts"] == 1

    for query, word in (
        ("per_page=0", "per_page"),
        ("per_page=1001", "per_page"),
        ("page=0", "page"),
        ("page=x", "page"),
        ("per_page=2&page=3", "page=3"),
        ("state=bogus", "bogus"),
        ("colour=red", "colour"),
    ):
        refused = _json(world, f"/api/v1/status?{query}", 400)
        assert refused["exit_code"] == 2 and word in refused["message"], query
        assert "\n" not in refused["message"]


def test_the_series_is_sampled_from_start_and_keeps_its_last_points(etcd_served: Served) -> None:
    world = etcd_served
    assert world.cli("set", "job=train", "gpus=1", "host=node3").code == 0

    def full() -> Any:
        series = _json(world, "/api/v1/series")
        return series if len(series["t"]) == 3 and series["total"]["held"][-1] == 1 else None

    series = wait_for("three samples after the set", full)
    assert series["interval_seconds"] == 0.2
    assert series["t"] == sorted(series["t"])
    total = series["total"]
    assert total["held"][-1] + total["free"][-1] + total["idle"][-1] == 14  # 4 + 8 + 2 GPUs
    assert series["pools"]["inference"]["held"][-1] == 1
    assert series["pools"]["a100"]["free"][-1] == 8
    assert series["utilisation_percent"][-1] is None  # no agent reports it
    assert series["queue"][-1] == 0

    def newer() -> Any:
        later = _json(world, "/api/v1/series")
        return later if later["t"][0] > series["t"][0] else None

    later = wait_for("a newer sample", newer)
    assert len(later["t"]) == 3  # bounded by --series-points

    # An agent's counts record (leased, as its agent keeps it) carries its host's utilisation.
    store = open_store(world.env["ALLOCATOR_STORE"])
    key = KeyLayout(world.env["ALLOCATOR_PREFIX"]).host_counts("node2")
    try:
        counts = HostCounts("node2", tuple(range(8)), free=8, utilisation=70)
        store.put(key, counts.to_json(), lease=store.grant_lease(60))
    finally:
        store.close()
    plotted = wait_for(
        "the utilisation sampled",
        lambda: _json(world, "/api/v1/series")["utilisation_percent"][-1] == 70.0,
    )
    assert plotted


def _without(document: dict[str, Any], *names: str) -> dict[str, Any]:
    return {key: value for key, value in document.items() if key not in names}


def test_filters_and_the_summary_answer_what_the_cli_prints(etcd_served: Served) -> None:
    world = etcd_served
    assert world.cli("set", "job=train", "gpus=1", "host=node2").code == 0
    assert world.cli("set", "job=eval", "gpus=0", "host=node3").code == 0
    assert world.cli("set", "job=wide", "gpus=0", "host=node1,node2").code == 0
    wait_for("the sets", lambda: _cells(world)["node1"][3][0] == "held")
    for query in (
        "job=train",
        "job=wide",
        "state=held",
        "host=node[1-2]",
        "pool=inference,a100&state=free",
        "job=train,eval&state=held",
        "job=train&state=free",
    ):
        words = query.replace("&", " ").split()
        printed = json.loads(world.cli("status", *words, "-o", "json").out)
        answered = _json(world, f"/api/v1/status?{query}")
        assert _without(answered, "revision", "page") == _without(printed, "revision"), query
        assert answered["page"]["hosts"] == len(printed["hosts"])
    assert [g["job"] for g in _json(world, "/api/v1/status?job=wide")["jobs_across_hosts"]] == [
        "wide"
    ]
    printed = json.loads(world.cli("status", "--summary", "-o", "json").out)
    answered = _json(world, "/api/v1/summary")
    assert _without(answered, "revision") == _without(printed, "revision")
    assert answered["total"]["held"] == 4
