"""The page's answers at a glance, in a real browser: where free GPUs are, what is broken,
who uses the most; fed by the event stream (polling only while it fails).

At 2 hosts each panel is checked against what the store holds and a set shows
on the page through the stream alone. At 25,000 hosts (the bench's busy fleet,
a usage rollup written beside it) the lists stay short, the top teams are in
the order of their GPU-hours, and the page stays within a few screens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serve_harness import Served
from tests.e2e.test_serve import CHROMIUM
from tests.support.waiting import wait_for

#: 200,000 GPUs: the largest single training clusters today.
FLEET_HOSTS = 25_000
#: The page at 1280 x 900 stays within this many screens, whatever the fleet's size.
SCREENS = 4
VIEWPORT = {"width": 1280, "height": 900}


def _two_hosts_policy(user: str) -> str:
    return f"""\
version: 1
hosts:
  node1: {{gpus: 4}}
  node2: {{gpus: 8, pool: a100}}
pools:
  default: {{hosts: [node1]}}
  a100: {{hosts: [node2]}}
teams:
  vision: {{members: [{user}]}}
  speech: {{members: [carol]}}
jobs:
  train: {{command: [python, -m, train]}}
  eval: {{command: [python, -m, eval]}}
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise AssertionError("chromium is missing: run tools/install-test-servers")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def _publish_agents(url: str, prefix: str) -> None:
    """node2's agent finds its GPU 7 unhealthy; node1's record outlived its lease."""
    from allocator.records.gpu_info import GpuInfo
    from allocator.records.keys import KeyLayout
    from allocator.records.types import AgentRecord
    from allocator.store import open_store

    layout = KeyLayout(prefix)
    node1 = AgentRecord(host="node1", gpus=tuple(GpuInfo(i) for i in range(4)))
    node2 = AgentRecord(
        host="node2", gpus=tuple(GpuInfo(i) for i in range(8)), unhealthy={7: "Xid 79"}
    )
    store = open_store(url)
    try:
        store.put(layout.agent("node1"), node1.to_json())
        store.put(layout.agent("node2"), node2.to_json(), lease=store.grant_lease(120))
    finally:
        store.close()


def _rows(page: Any, panel: str, *attributes: str) -> list[list[str]]:
    """The rows a panel lists, each as its ``data-`` attributes."""
    return page.evaluate(  # type: ignore[no-any-return]
        """([panel, names]) => [...document.querySelectorAll(`#${panel} tr[data-${names[0]}]`)]
            .map((tr) => names.map((n) => tr.getAttribute("data-" + n)))""",
        [panel, list(attributes)],
    )


def _fleet_reads(page: Any) -> list[str]:
    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if "/api/v1/fleet" in r.url else None)
    return reads


@pytest.mark.slow
def test_two_hosts_free_broken_and_top_panels_follow_the_stream(
    browser: Any, etcd_server: Any, prefix: str, tmp_path: Path
) -> None:
    from allocator.util.identity import os_user

    user = os_user()
    policy = tmp_path / "policy.yaml"
    policy.write_text(_two_hosts_policy(user))
    world = Served(str(etcd_server.url), prefix, tmp_path, policy=policy)
    try:
        assert world.cli("set", "job=train", "gpus=1", "host=node1").code == 0
        assert world.cli("set", "job=eval", "gpus=0,1", "host=node2").code == 0
        _publish_agents(str(etcd_server.url), prefix)
        page = browser.new_page(viewport=VIEWPORT)
        reads = _fleet_reads(page)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(world.base + "/")
        page.wait_for_selector('#heatmap[data-feed="stream"][data-cells="12"]')

        # Free GPUs: node2 has 5 (two held, one unhealthy), node1 3; most first.
        free = lambda: _rows(page, "free", "host", "free")  # noqa: E731
        wait_for("the free list", lambda: free() == [["node2", "5"], ["node1", "3"]])
        assert "8 of 12 GPUs free, on 2 hosts" in page.inner_text("#free-total")
        page.select_option("#f-pool", "a100")
        wait_for("the pool's free list", lambda: free() == [["node2", "5"]])
        assert page.inner_text("#free-of") == "in pool a100"
        page.select_option("#f-pool", "")

        # Broken: the unhealthy GPU with its reason, the agent without a lease; with counts.
        gpu = page.wait_for_selector('#broken tr[data-host="node2"][data-gpu="7"]')
        assert gpu is not None and "Xid 79" in gpu.inner_text()
        agent = page.wait_for_selector('#broken tr[data-agent="node1"]')
        assert agent is not None and "without a lease" in agent.inner_text()
        assert page.inner_text("#broken-count") == "(1 unhealthy GPUs, 1 agents not up)"

        # Top users and teams: one row each; the user links to the heatmap filtered to them.
        page.wait_for_selector(f'#top-users tr[data-holder="{user}"]')
        assert [row[0] for row in _rows(page, "top-teams", "holder")] == ["vision"]
        page.select_option("#usage-window", "24h")
        page.wait_for_selector(f'#top-users tr[data-holder="{user}"]')
        page.click(f'#top-users tr[data-holder="{user}"] a')
        page.wait_for_selector(f"#heatmap[data-filter='user={user}']")
        assert page.get_attribute("#heatmap", "data-matching") == "3"  # train's 1, eval's 2
        page.fill("#f-user", "")
        page.wait_for_selector("#heatmap[data-filter='']")
        page.click('#top-teams tr[data-holder="vision"] a')  # the team's members' jobs
        page.wait_for_selector(f"#heatmap[data-filter='user={user}']")
        assert page.get_attribute("#heatmap", "data-matching") == "3"

        # A set shows through the stream: the grid and the free list, no grid read.
        assert world.cli("set", "job=more", "gpus=4,5", "host=node2").code == 0
        expected = [["node1", "3"], ["node2", "3"]]  # as many: by name
        wait_for("the stream's change", lambda: free() == expected)
        assert _drawn_states(page)["held"] == 5 and reads == []
        # A new policy rebuilds every host: the stream says resync, the page opens a new one.
        policy.write_text(
            _two_hosts_policy(user).replace("hosts:\n", "hosts:\n  node3: {gpus: 2}\n", 1)
        )
        assert world.cli("policy", "apply", str(policy)).code == 0
        page.wait_for_selector('#heatmap[data-feed="stream"][data-hosts="3"][data-cells="14"]')
        assert page.evaluate("document.documentElement.scrollHeight") < SCREENS * 900
        assert errors == [] and reads == []

        # Without the stream the page reads the grid every 2 s instead.
        polled = browser.new_page(viewport=VIEWPORT)
        polled.route("**/api/v1/events*", lambda route: route.abort())
        polled.goto(world.base + "/")
        polled.wait_for_selector('#heatmap[data-feed="polling"][data-cells="14"]')
        assert _drawn_states(polled)["held"] == 5
    finally:
        world.close()


def _drawn_states(page: Any) -> dict[str, int]:
    return json.loads(page.get_attribute("#heatmap", "data-states"))  # type: ignore[no-any-return]


TEAMS = """\
teams:
  platform: {members: [bench]}
  vision: {members: [alice, bob]}
  speech: {members: [carol]}
"""
#: Holdings ended an hour ago, 10 h long, 8 GPUs each: (holder, how many).
ENDED = (("alice", 40), ("carol", 30), ("bob", 20))


def _teams_and_usage(url: str, prefix: str, hosts: int) -> None:
    """The busy fleet's policy with teams, and a usage rollup of holdings that ended today.

    The bench's jobs (held by ``bench``, of team platform) are open holdings,
    counted from the assignments; alice, bob and carol's ended ones come from the rollup.
    """
    import time
    from datetime import UTC, datetime

    import msgspec

    from allocator.control.client import Allocator
    from allocator.history.rollup import day_prefix, marker_key, marker_value
    from allocator.records.keys import KeyLayout
    from allocator.store import Put, open_store
    from allocator.util.times import utc_now
    from bench.fleet import busy_policy

    history = KeyLayout(prefix).history
    end = time.time() - 3600
    day = day_prefix(history, datetime.fromtimestamp(end, UTC))
    store = open_store(url)
    try:
        Allocator(store, prefix=prefix, actor="bench@fleet").apply_policy(
            busy_policy(hosts) + TEAMS, "fleet.yaml"
        )
        writes = [Put(marker_key(history), marker_value(utc_now()))]
        for holder, count in ENDED:
            rows = [
                ("node0000", f"{holder}-{n}", holder, 8, 8, end - 36_000, end) for n in range(count)
            ]
            writes.append(Put(f"{day}test/{holder}", msgspec.json.encode(rows)))
        store.txn([], writes)
    finally:
        store.close()


def _free_hosts(fleet: dict[str, Any]) -> list[list[str]]:
    """The free list the page should show: hosts by free cells, most first, then by name."""
    free = str(fleet["states"].index("free"))
    counted = [(row[3].count(free), row[0]) for row in fleet["hosts"] if free in row[3]]
    return [[name, str(n)] for n, name in sorted(counted, key=lambda c: (-c[0], c[1]))]


@pytest.mark.slow
def test_a_large_fleet_s_page_lists_free_hosts_broken_gpus_and_top_teams_in_a_few_screens(
    browser: Any, prefix: str, tmp_path: Path
) -> None:
    from bench.fleet import write_busy_fleet
    from tests.e2e.test_serve_page import _keep

    url = f"sqlite://{tmp_path / 'fleet.db'}"
    write_busy_fleet(url, prefix, FLEET_HOSTS)
    _teams_and_usage(url, prefix, FLEET_HOSTS)
    world = Served(url, prefix, tmp_path, policy=None, ready="/api/v1/fleet")
    try:
        fleet = wait_for(
            "serve to mirror the fleet", lambda: _whole_fleet(world), timeout=120, every=0.5
        )
        page = browser.new_page(viewport=VIEWPORT)
        reads = _fleet_reads(page)
        page.goto(world.base + "/")
        page.wait_for_selector('#heatmap[data-feed="stream"][data-first-draw-ms]', timeout=60_000)

        expected = _free_hosts(fleet)
        wait_for("the free list", lambda: _rows(page, "free", "host", "free") == expected[:20])
        more = f"and {len(expected) - 20:,} more hosts with a free GPU"
        assert more in page.inner_text("#free")
        cells = "".join(row[3] for row in fleet["hosts"])
        unhealthy = cells.count(str(fleet["states"].index("unhealthy")))
        page.wait_for_selector('#broken tr[data-gpu="5"]')
        assert page.inner_text("#broken-count").startswith(f"({unhealthy:,} unhealthy GPUs")
        assert all(
            "Xid 79" in text for text in page.locator("#broken tr[data-gpu]").all_inner_texts()
        )
        assert page.locator("#broken tr[data-gpu]").count() == 20

        # Top teams and users: one row each, by GPU-hours (bench's open jobs lead).
        wait_for("the top teams", lambda: len(_rows(page, "top-teams", "holder")) == 3)
        teams = _rows(page, "top-teams", "holder", "gpu-hours")
        assert [t[0] for t in teams] == ["platform", "vision", "speech"]
        assert float(teams[1][1]) == pytest.approx(60 * 8 * 10)  # alice's 40 and bob's 20
        users = lambda: [u[0] for u in _rows(page, "top-users", "holder")]  # noqa: E731
        wait_for("the top users", lambda: users() == ["bench", "alice", "carol", "bob"])
        code, body, _ = world.get("/api/v1/usage?jobs=count&limit=10&since=7d&by=user")
        assert code == 200 and len(body) < 2_000  # 4 rows, not every job's name

        height = page.evaluate("document.documentElement.scrollHeight")
        print(f"\n{FLEET_HOSTS:,} hosts: the page is {height} px tall")
        assert height < SCREENS * VIEWPORT["height"] and reads == []
        _keep(page, tmp_path, "status-page-fleet.png")
    finally:
        world.close()


def _whole_fleet(world: Served) -> dict[str, Any] | None:
    code, body, _ = world.get("/api/v1/fleet", timeout=30)
    fleet: dict[str, Any] | None = json.loads(body) if code == 200 else None
    return fleet if fleet and len(fleet["hosts"]) == FLEET_HOSTS else None
