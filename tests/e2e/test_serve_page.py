"""The fleet status page in a real browser, at 2 hosts and at 25,000 hosts x 8 GPUs.

Debian's chromium driven by playwright reads a real ``allocator serve``. At
2 hosts every panel is checked against what the API answers and what the
store holds: totals, the heatmap's cells (by their pixels), a filter dimming
the right ones, the drill-down, the queue and the plots. At 25,000 hosts (a
SQLite store written in bulk with the bench's record builders) the page must
draw all 200,000 cells with a small DOM; the time to the first whole
heatmap, which the page marks itself, is printed (the figure the manual
quotes) and only held to a generous bound. Set ``ALLOCATOR_SCREENSHOT=DIR``
to keep the 2-host page's picture there (``make screenshot`` writes the manual's;
the large fleet's is :mod:`tests.e2e.test_serve_page_panels`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serve_harness import Served
from tests.e2e.test_serve import CHROMIUM, _publish_as_agent
from tests.support.waiting import wait_for

TWO_HOSTS = """\
version: 1
hosts:
  node1: {gpus: 4}
  node2: {gpus: 8, pool: a100}
pools:
  default:
    hosts: [node1]
    idle: {after: 2h, action: warn}
  a100:
    hosts: [node2]
jobs:
  train: {command: [python, -m, train], fallback: wait}
  eval: {command: [python, -m, eval], fallback: wait}
fallback:
  wait: {action: wait}
"""
#: 200,000 GPUs: the largest single training clusters today.
FLEET_HOSTS = 25_000
#: The page stays a page: a few hundred nodes, whatever the fleet's size.
DOM_NODES_BOUND = 2_000


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


@pytest.fixture
def two_hosts(etcd_server: Any, prefix: str, tmp_path: Path) -> Iterator[Served]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(TWO_HOSTS)
    world = Served(str(etcd_server.url), prefix, tmp_path, "--sample-seconds", "1", policy=policy)
    try:
        yield world
    finally:
        world.close()


def _pixel(page: Any, host: str, gpu: int) -> list[int]:
    """The colour drawn in the middle of ``host``'s GPU ``gpu`` on the heatmap."""
    return page.evaluate(  # type: ignore[no-any-return]
        """([host, gpu]) => {
            const box = heatmap.cellBox(heatmap.byName.get(host), gpu);
            const x = Math.floor(box.x + box.w / 2), y = Math.floor(box.y + box.h / 2);
            const data = $("heatmap").getContext("2d").getImageData(x, y, 1, 1).data;
            return [data[0], data[1], data[2]];
        }""",
        [host, gpu],
    )


def _inked(page: Any, host: str) -> bool:
    """Whether text is drawn where ``host``'s name goes: dark pixels in its label's box."""
    return page.evaluate(  # type: ignore[no-any-return]
        """(host) => {
            const dpr = window.devicePixelRatio || 1;
            const box = heatmap.labelBox(heatmap.byName.get(host));
            const data = $("heatmap").getContext("2d").getImageData(
                box.x * dpr, box.y * dpr, box.w * dpr, box.h * dpr).data;
            for (let i = 0; i < data.length; i += 4) if (data[i] < 120) return true;
            return false;
        }""",
        host,
    )


def _colour(page: Any, state: str, dim: bool = False) -> list[int]:
    hex_colour: str = page.evaluate(
        "([s, dim]) => dim ? dimmed(STATE_COLOURS[s]) : STATE_COLOURS[s]", [state, dim]
    )
    return [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]


def _drawn(page: Any, attribute: str) -> Any:
    return json.loads(page.get_attribute("#heatmap", f"data-{attribute}"))


def _keep(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    keep = os.environ.get("ALLOCATOR_SCREENSHOT")
    if keep:
        shutil.copyfile(tmp_path / name, Path(keep) / name)


@pytest.mark.slow
def test_the_page_at_two_hosts_shows_totals_cells_filters_drill_down_queue_and_plots(
    two_hosts: Served, browser: Any, prefix: str, etcd_server: Any, tmp_path: Path
) -> None:
    world = two_hosts
    assert world.cli("set", "job=train", "gpus=1", "host=node1").code == 0
    assert world.cli("set", "job=eval", "gpus=0,1", "host=node2").code == 0
    assert world.cli("set", "job=dist", "gpus=2", "host=node1,node2").code == 0  # across both
    _publish_as_agent(str(etcd_server.url), prefix)  # node1: train idle 2h05m, bob on GPU 3
    with world.waiting_set("job=late", "gpus=1", "host=node1"):
        wait_for("the queue to list the waiter", lambda: _queued(world))
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []  # script errors, refused resources (the page's CSP) included
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(world.base + "/")
        page.wait_for_selector('#heatmap[data-cells="12"]')
        page.wait_for_selector('#summary-table tr[data-pool="a100"]')
        fleet = json.loads(world.get("/api/v1/fleet")[1])
        grid = {row[0]: [fleet["states"][int(c)] for c in row[3]] for row in fleet["hosts"]}
        assert grid == {
            "node1": ["free", "idle", "held", "unassigned"],
            "node2": ["held", "held", "held"] + ["free"] * 5,
        }
        wait_for("the page to draw the same", lambda: _drawn(page, "states")["idle"] == 1)
        assert page.get_attribute("#heatmap", "data-host-labels") == "2"
        assert all(_inked(page, host) for host in grid)  # each name drawn above its cells
        assert _drawn(page, "states") | {"unknown": 0} == {
            "free": 6, "held": 4, "idle": 1, "unassigned": 1, "unhealthy": 0,
            "fallback": 0, "reserved": 0, "unknown": 0,
        }  # fmt: skip
        for host, states in grid.items():
            for gpu, state in enumerate(states):
                assert _pixel(page, host, gpu) == _colour(page, state), (host, gpu, state)

        # Totals: each number the page shows is the summary's.
        summary = json.loads(world.get("/api/v1/summary")[1])
        shown = page.locator("#summary-table td[data-column]")
        assert shown.count() > 0
        for n in range(shown.count()):
            cell = shown.nth(n)
            pool = cell.locator("xpath=..").get_attribute("data-pool")
            column = cell.get_attribute("data-column")
            row = summary["total"] if pool == "total" else _pool_row(summary["pools"], pool)
            assert cell.inner_text() == f"{row[column]:,}", (pool, column)

        # A filter dims every cell but those it matches: here, the held ones.
        _filter(page, "#f-state", "held", "state=held", matching=4)
        assert _pixel(page, "node2", 0) == _colour(page, "held")
        assert _pixel(page, "node2", 3) == _colour(page, "free", dim=True)
        assert _pixel(page, "node1", 1) == _colour(page, "idle", dim=True)
        assert "4 of 12 GPUs match" in page.inner_text("#matching")
        _filter(page, "#f-state", "", "", matching=12)
        _filter(page, "#f-job", "train", "job=train", matching=1)  # the status API's job=
        assert _pixel(page, "node1", 1) == _colour(page, "idle")
        assert _pixel(page, "node2", 0) == _colour(page, "held", dim=True)
        _filter(page, "#f-job", "", "", matching=12)
        _filter(page, "#f-user", "bob", "user=bob", matching=1)  # his process on node1's GPU 3
        assert _pixel(page, "node1", 3) == _colour(page, "unassigned")
        _filter(page, "#f-user", "nobody", "user=nobody", matching=0)
        _filter(page, "#f-user", "", "", matching=12)
        _filter(page, "#f-pool", "a100", "pool=a100", matching=8)
        _filter(page, "#f-pool", "", "", matching=12)
        _filter(page, "#f-host", "node[1-1]", "host=node[1-1]", matching=4)
        _filter(page, "#f-host", "", "", matching=12)

        # Drill-down: searching a host opens it, as does a click on one of its GPUs.
        page.fill("#f-host", "node2")
        page.press("#f-host", "Enter")
        page.wait_for_selector('#host-panel td[data-host="node2"][data-gpu="0"]')
        assert page.inner_text('td[data-host="node2"][data-gpu="0"] .holder') == "eval"
        _filter(page, "#f-host", "", "", matching=12)
        page.focus("#heatmap")  # the keyboard: arrows move over the cells, Enter opens one
        page.keyboard.press("ArrowRight")
        assert page.inner_text("#tooltip") == "node2 · GPU 1 · held · a100 · no agent"
        page.keyboard.press("ArrowLeft")
        page.keyboard.press("Enter")
        page.wait_for_selector('#host-panel td[data-host="node2"][data-gpu="0"]')
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.id") == "f-host"
        box = page.evaluate("() => heatmap.cellBox(heatmap.byName.get('node1'), 1)")
        page.click("#heatmap", position={"x": box["x"] + 1, "y": box["y"] + 1})
        page.wait_for_selector('#host-panel td[data-host="node1"][data-gpu="1"] .holder')
        assert page.inner_text("#host-title") == "node1"
        assert page.inner_text('td[data-host="node1"][data-gpu="1"] .holder') == "train"
        assert "idle 2h05m: past its idle rule" in page.inner_text(
            'td[data-host="node1"][data-gpu="1"]'
        )
        assert "unassigned: bob pid 4242" in page.inner_text('td[data-host="node1"][data-gpu="3"]')
        assert page.locator("#host-panel td.gpu").count() == 4
        page.click("#host-history")  # the host's history, read from the store
        page.wait_for_selector("#history td:text-is('node1')")
        assert page.inner_text("#history-of") == "of node1"

        # Idle holders, unassigned use, the queue.
        page.wait_for_selector('#idle tr[data-host="node1"]')
        assert "past its idle rule" in page.inner_text('#idle tr[data-host="node1"]')
        assert page.locator('#unassigned tr[data-host="node1"]').inner_text().endswith("3")
        page.wait_for_selector("#queue td:text-is('late')")
        across = page.inner_text('#groups tr[data-group="dist"]')
        assert "node1, node2" in across and "node2 rank 1: 2 (no agent)" in across

        # Plots: serve samples every second here; the total's last point is the fleet now.
        page.wait_for_selector('#plots figure[data-plot="total"] canvas')
        page.wait_for_selector('#plots figure[data-plot="pool-a100"] canvas')
        last = wait_for("a sample of the queue", lambda: _last_plotted(page, "queue"))
        assert last == {"queued": 1}
        assert _last_plotted(page, "total")["held"] >= 2  # type: ignore[index]
        assert page.evaluate("document.getElementsByTagName('*').length") < DOM_NODES_BOUND
        assert errors == []
        _keep(page, tmp_path, "status-page.png")
        assert page.url.endswith("/#host=node1")  # the drill-down has a link of its own
        linked = browser.new_page()
        linked.goto(world.base + "/#host=node2")
        linked.wait_for_selector('#host-panel td[data-host="node2"][data-gpu="2"]')


def _pool_row(pools: Any, pool: str | None) -> dict[str, Any]:
    """A pool's row of the summary (``status --summary -o json``: a list of rows)."""
    if isinstance(pools, dict):
        return pools[pool]  # type: ignore[no-any-return]
    return next(row for row in pools if (row["pool"] or "no pool") == pool)  # type: ignore[no-any-return]


def _filter(page: Any, field: str, value: str, applied: str, matching: int) -> None:
    """Set one filter field and wait until the heatmap is drawn with it; check the count."""
    if field in ("#f-state", "#f-pool"):
        page.select_option(field, value)
    else:
        page.fill(field, value)
    page.wait_for_selector(f"#heatmap[data-filter='{applied}']")
    assert page.get_attribute("#heatmap", "data-matching") == str(matching), applied


def _queued(world: Served) -> bool:
    code, body, _ = world.get("/api/v1/queue")
    return code == 200 and bool(json.loads(body)["queue"])


def _last_plotted(page: Any, plot: str) -> dict[str, Any] | None:
    last = page.get_attribute(f'#plots figure[data-plot="{plot}"]', "data-last")
    values = json.loads(last) if last else None
    return values if values and all(v is not None for v in values.values()) else None


def test_static_files_are_served_with_cache_headers(two_hosts: Served) -> None:
    code, body, headers = two_hosts.get("/static/vendor/uplot/uPlot.iife.min.js")
    assert code == 200 and headers["content-type"].startswith("text/javascript")
    assert headers["cache-control"] == "public, max-age=86400" and headers["etag"]
    readme = Path(__file__).parents[2] / "allocator/serve/static/vendor/uplot/README.md"
    import hashlib

    assert hashlib.sha256(body).hexdigest() in readme.read_text()  # the file its README names
    request = urllib_request(two_hosts.base + "/static/page.js", headers["etag"])
    assert request == 200  # another file's ETag: the file itself
    _, _, own = two_hosts.get("/static/page.js")
    assert own["cache-control"] == "no-cache"
    assert urllib_request(two_hosts.base + "/static/page.js", own["etag"]) == 304
    policy = two_hosts.get("/")[2]["content-security-policy"]  # its own scripts, nothing else
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe" not in policy and "http" not in policy
    assert two_hosts.get("/static/../app.py")[0] == 404
    assert two_hosts.get("/static/nothing.js")[0] == 404


def urllib_request(url: str, etag: str) -> int:
    """The status of a GET of ``url`` sent with ``If-None-Match: etag``."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"If-None-Match": etag})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_the_page_draws_a_25000_host_fleet_whole_with_a_small_dom(
    browser: Any, prefix: str, tmp_path: Path
) -> None:
    from bench.fleet import write_busy_fleet

    url = f"sqlite://{tmp_path / 'fleet.db'}"
    write_busy_fleet(url, prefix, FLEET_HOSTS)  # about 226,000 keys in seconds
    world = Served(
        url, prefix, tmp_path, "--sample-seconds", "1", policy=None, ready="/api/v1/fleet"
    )
    try:
        wait_for(
            "serve to mirror the fleet", lambda: _fleet_hosts(world) == FLEET_HOSTS, timeout=60
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(world.base + "/")
        page.wait_for_selector("#heatmap[data-first-draw-ms]", timeout=60_000)
        first_draw = float(page.get_attribute("#heatmap", "data-first-draw-ms"))
        marked = page.evaluate("performance.getEntriesByName('heatmap-drawn')[0].startTime")
        print(f"\n{FLEET_HOSTS:,} hosts: first whole heatmap {first_draw:.0f} ms after navigation")
        assert abs(marked - first_draw) < 50
        assert page.get_attribute("#heatmap", "data-cells") == str(FLEET_HOSTS * 8)
        # The page's panels and stream ask too: under the suite's load the grid may take longer.
        fleet = json.loads(world.get("/api/v1/fleet", timeout=60)[1])
        cells = "".join(row[3] for row in fleet["hosts"])
        assert _drawn(page, "states") == {
            s: cells.count(str(n)) for n, s in enumerate(fleet["states"])
        }
        assert all(
            _drawn(page, "states")[s] for s in ("free", "held", "idle", "unhealthy", "unassigned")
        )
        # How fast is the bench's row (bench/bench_page.py: first whole heatmap, 25,000
        # hosts), measured on a quiet machine; a test under the suite's load only prints it.
        assert page.evaluate("document.getElementsByTagName('*').length") < DOM_NODES_BOUND
        last = f"node{FLEET_HOSTS - 1}"
        page.fill("#f-host", last)
        page.press("#f-host", "Enter")
        page.wait_for_selector(f'#host-panel td[data-host="{last}"][data-gpu="7"]')
        page.fill("#f-host", "")
        page.wait_for_selector(f'#heatmap[data-matching="{FLEET_HOSTS * 8}"]')
    finally:
        world.close()


def _fleet_hosts(world: Served) -> int:
    code, body, _ = world.get("/api/v1/fleet")
    return len(json.loads(body)["hosts"]) if code == 200 else 0
