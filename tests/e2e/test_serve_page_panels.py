"""The page's answers at a glance, in a real browser: where free GPUs are, what is broken,
who uses the most; fed by the event stream (polling only while it fails).

At 2 hosts each panel is checked against what the store holds and a set shows
on the page through the stream alone. At 12,500 hosts (the bench's busy fleet,
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

FLEET_HOSTS = 12_500
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
        assert page.inner_text("#broken-count") == "(1 unhealthy GPUs, 1 agents down)"

        # Top users and teams: one row each; the user links to the heatmap filtered to them.
        page.wait_for_selector(f'#top-users tr[data-holder="{user}"]')
        assert [row[0] for row in _rows(page, "top-teams", "holder")] == ["vision"]
        page.select_option("#usage-window", "24h")
        page.wait_for_selector(f'#top-users tr[data-holder="{user}"]')
        page.click(f'#top-users tr[data-holder="{user}"] a')
        page.wait_for_selector(f"#heatmap[data-filter='user={user}']")
        assert page.get_attribute("#heatmap", "data-matching") == "3"  # train's 1, eval's 2

        # A set shows through the stream: the grid and the free list, no grid read.
        assert world.cli("set", "job=more", "gpus=4,5", "host=node2").code == 0
        expected = [["node1", "3"], ["node2", "3"]]  # as many: by name
        wait_for("the stream's change", lambda: free() == expected)
        assert _drawn_states(page)["held"] == 5 and reads == []
        assert page.evaluate("document.documentElement.scrollHeight") < SCREENS * 900
        assert errors == []

        # Without the stream the page reads the grid every 2 s instead.
        polled = browser.new_page(viewport=VIEWPORT)
        polled.route("**/api/v1/events*", lambda route: route.abort())
        polled.goto(world.base + "/")
        polled.wait_for_selector('#heatmap[data-feed="polling"][data-cells="12"]')
        assert _drawn_states(polled)["held"] == 5
    finally:
        world.close()


def _drawn_states(page: Any) -> dict[str, int]:
    return json.loads(page.get_attribute("#heatmap", "data-states"))  # type: ignore[no-any-return]
