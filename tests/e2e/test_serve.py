"""``allocator serve`` for real: its API against the CLI, its metrics, and the page in a browser.

The server is a real ``allocator serve`` process on a free loopback port,
reading a real etcd (or SQLite) that the CLI writes to. The browser is
Debian's chromium driven by playwright (``tools/install-test-servers``
installs it): a host's drill-down shows a ``set`` without a reload, and
with etcd stopped the page says the store is unavailable and keeps the last
state. The fleet page's own tests (heatmap, filters, plots, 12,500 hosts) are
in ``test_serve_page.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The project's own module: one that does not import is a failure, never a skip.
import allocator.history.stream  # noqa: F401
from allocator.serve.watcher import QUIET_SECONDS
from tests.e2e.serve_harness import Served
from tests.support.prometheus import parse_exposition
from tests.support.waiting import wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_the_api_answers_what_the_cli_prints_and_metrics_follow_a_set(served: Served) -> None:
    assert served.cli("set", "job=train", "gpus=1", "host=node1").code == 0
    printed = json.loads(served.cli("status", "-o", "json").out)

    # The store's revision is shared with every other test's writes (one etcd),
    # so the API's document is compared without it: serve's mirror stands at
    # the last change under its prefix, the CLI's read at the store's latest.
    cli_revision = printed.pop("revision")

    def caught_up() -> dict[str, Any] | None:
        code, body, _ = served.get("/api/v1/status")
        data: dict[str, Any] = json.loads(body)
        return (
            data if code == 200 and {**data, "revision": 0} == {**printed, "revision": 0} else None
        )

    answered = wait_for("the API to show the set", caught_up)
    assert 0 < answered.pop("revision") <= cli_revision and answered == printed
    code, body, headers = served.get("/metrics")
    assert code == 200 and headers["content-type"].startswith("text/plain")
    scrape = parse_exposition(body.decode())
    assert scrape.value("allocator_fleet_gpus", host="node1", state="assigned") == 1.0
    assert scrape.value("allocator_fleet_gpus", host="node1", state="free") == 3.0
    assert scrape.value("allocator_fleet_agents", state="none") == 3.0  # the example's 3 hosts
    assert scrape.value("allocator_store_up") == 1.0


def test_an_open_event_stream_gets_the_fleet_and_does_not_hold_up_a_stop(served: Served) -> None:
    with urllib.request.urlopen(served.base + "/api/v1/events", timeout=10) as stream:
        assert stream.readline() == b"event: fleet\n"
        document = json.loads(stream.readline().removeprefix(b"data: "))
        assert document["store"]["up"] is True and document["loaded"] is True
        assert [h["host"] for h in document["status"]["hosts"]] == ["node1", "node2", "node3"]
        served.close()  # SIGTERM while the stream is open
        # uvicorn shuts down cleanly, then ends by the signal it caught (not our SIGKILL).
        assert served.process.returncode == -signal.SIGTERM
    log = served.log_path.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log


def test_a_one_host_change_comes_on_the_event_stream_as_that_host_only(served: Served) -> None:
    with urllib.request.urlopen(served.base + "/api/v1/events", timeout=10) as stream:
        assert stream.readline() == b"event: fleet\n"
        stream.readline(), stream.readline()  # the snapshot, its blank line
        assert served.cli("set", "job=train", "gpus=1", "host=node2").code == 0
        for line in stream:  # a read that outlasts the timeout fails the test
            if line.startswith(b"data: ") and b"train" in line:
                break
        change = json.loads(line.removeprefix(b"data: "))
        assert [h["host"] for h in change["hosts"]] == ["node2"] and change["removed"] == []
        assert b'"host":"node1"' not in line and b'"host":"node3"' not in line
        assert any(g["holder"] == "train" for g in change["hosts"][0]["gpus"])
        assert change["grid"] == [["node2", 0, "none", "01000000"]]  # the page's row


def test_the_page_s_small_answers_and_the_grid_stream_refuse_what_they_do_not_take(
    served: Served,
) -> None:
    assert served.cli("set", "job=train", "gpus=0", "host=node1").code == 0
    with urllib.request.urlopen(served.base + "/api/v1/events?snapshot=grid", timeout=10) as stream:
        assert stream.readline() == b"event: fleet\n"
        grid = json.loads(stream.readline().removeprefix(b"data: "))["grid"]
    assert grid == json.loads(served.get("/api/v1/fleet")[1]) | {
        "generated_at": grid["generated_at"]
    }
    code, body, _ = served.get("/api/v1/free?limit=1")
    free = json.loads(body)
    assert code == 200 and free["hosts_total"] == 3 and len(free["hosts"]) == 1
    assert served.get("/api/v1/broken")[0] == 200
    for path in (
        "/api/v1/events?snapshot=everything",
        "/api/v1/free?pool=nope",
        "/api/v1/free?limit=0",
        "/api/v1/broken?host=node1",
    ):
        code, body, _ = served.get(path)
        assert code == 400 and json.loads(body)["exit_code"] == 2, path


def test_history_api_answers_what_the_cli_prints(served: Served) -> None:
    assert served.cli("set", "job=train", "gpus=1", "host=node1").code == 0
    assert served.cli("release", "job=train").code == 0
    printed = json.loads(served.cli("history", "job=train", "-o", "json").out)
    code, body, _ = served.get("/api/v1/history?job=train")
    assert code == 200 and json.loads(body) == printed
    assert served.get("/api/v1/history?gpu=x")[0] == 400


@pytest.mark.slow
def test_the_page_renders_updates_live_and_says_when_the_store_is_down(
    prefix: str, tmp_path: Path, etcd_server_private: Any
) -> None:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise AssertionError("chromium is missing: run tools/install-test-servers")
    world = Served(etcd_server_private.url, prefix, tmp_path)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 520})
            page.clock.install()  # the page's own clock, moved on below without a new document
            page.goto(world.base + "/")
            page.wait_for_selector('#heatmap[data-hosts="3"]')  # the example's node1-3
            page.fill("#f-host", "node1")
            page.press("#f-host", "Enter")  # the host's drill-down
            cell = 'td[data-host="node1"][data-gpu="1"] .holder'
            # Selectors, not string predicates: the page's CSP forbids eval, which polling uses.
            page.wait_for_selector(f"{cell}:text-is('free')")
            page.evaluate("window.notReloaded = true")

            assert world.cli("set", "job=train", "gpus=1", "host=node1").code == 0
            assert world.cli("set", "job=eval-nightly", "gpus=0", "host=node2").code == 0
            page.wait_for_selector(f"{cell}:text-is('train')")
            assert page.evaluate("window.notReloaded") is True  # live, not a reload
            assert page.locator('#host-panel tr[data-job="train"]').count() == 1

            _publish_as_agent(etcd_server_private.url, prefix)
            # The agent's record changes no cell: the drill-down reads it on its next
            # refresh (every 15 s of the page's clock), here at once.
            page.clock.fast_forward(15_000)
            page.wait_for_selector("#host-panel .agent-alive")
            page.wait_for_selector('td[data-host="node1"][data-gpu="3"] .stray')
            gpu3 = page.inner_text('td[data-host="node1"][data-gpu="3"]')
            assert "unassigned: bob pid 4242" in gpu3
            idle = page.inner_text('td[data-host="node1"][data-gpu="1"]')
            assert "idle 2h05m: past its idle rule" in idle
            # Ten minutes later and no change in the store: the idle time has grown with them.
            page.clock.run_for(10 * 60 * 1000)  # the page redraws every 5 s of its clock
            assert "idle 2h15m" in page.inner_text('td[data-host="node1"][data-gpu="1"]')
            assert "2h15m" in page.inner_text('#host-panel tr[data-job="train"]')

            etcd_server_private.stop()
            page.wait_for_selector("#banner:not([hidden])")
            assert "Store unavailable since" in page.inner_text("#banner")
            assert page.inner_text(cell) == "train"  # the last state stays on the page
            code, _, headers = world.get("/api/v1/status")
            assert code == 200 and headers["x-allocator-store"].startswith("unavailable since")
            browser.close()
    finally:
        world.close()


#: serve's promise for a hung store: the watch's quiet interval plus one call's deadline.
HANG_SECONDS = QUIET_SECONDS + 2.0  # the URL below gives each call 2 s
#: Slack for a loaded machine, on top of the promise (a hang guard, not the figure tested).
SLACK_SECONDS = 5.0


def _store_up(world: Served) -> float | None:
    code, body, _ = world.get("/metrics")
    return parse_exposition(body.decode()).value("allocator_store_up") if code == 200 else None


def _page_document_where(world: Served, wanted: Callable[[Any], bool]) -> Any:
    """The first document the page's event stream sends that is ``wanted``."""
    with urllib.request.urlopen(world.base + "/api/v1/events", timeout=10) as stream:
        for line in stream:  # a read that outlasts the timeout fails the test
            if line.startswith(b"data: "):
                document = json.loads(line.removeprefix(b"data: "))
                if wanted(document):
                    return document
    raise AssertionError("the event stream ended")


def test_a_hung_etcd_shows_as_down_within_its_deadline_and_up_when_it_resumes(
    prefix: str, tmp_path: Path, etcd_server_private: Any
) -> None:
    world = Served(etcd_server_private.url + "?timeout=2", prefix, tmp_path)
    try:
        wait_for("the store to be up", lambda: _store_up(world) == 1.0)
        os.kill(etcd_server_private.pid, signal.SIGSTOP)  # hung: connections open, no answer
        try:
            stopped = time.monotonic()
            wait_for(
                "allocator_store_up 0",
                lambda: _store_up(world) == 0.0,
                timeout=HANG_SECONDS + SLACK_SECONDS,
            )
            assert time.monotonic() - stopped >= 1.0  # judged by a deadline, not at once
            code, body, headers = world.get("/api/v1/status")
            assert code == 200 and headers["x-allocator-store"].startswith("unavailable since")
            assert json.loads(body)["hosts"]  # the last state read stays on show
            document = _page_document_where(world, lambda d: not d["store"]["up"])
            assert document["store"]["unavailable_since"] and document["loaded"] is True
        finally:
            os.kill(etcd_server_private.pid, signal.SIGCONT)
        wait_for("allocator_store_up 1 again", lambda: _store_up(world) == 1.0, timeout=20)
        assert "x-allocator-store" not in world.get("/api/v1/status")[2]
    finally:
        world.close()


def _publish_as_agent(url: str, prefix: str) -> None:
    """What node1's agent would publish: its leased record and train's worker record."""
    from datetime import timedelta

    from allocator.records.gpu_info import GpuInfo
    from allocator.records.keys import KeyLayout
    from allocator.records.types import AgentRecord, GpuProcess, WorkerRecord
    from allocator.store import open_store
    from allocator.util.times import format_time, utc_now

    layout = KeyLayout(prefix)
    notebook = GpuProcess(
        gpu=3, pid=4242, user="bob", command="python notebook.py", memory_used_mib=20480
    )
    agent = AgentRecord(
        host="node1", gpus=tuple(GpuInfo(i) for i in range(4)), unassigned=(notebook,)
    )
    idle_since = format_time(utc_now() - timedelta(hours=2, minutes=5, seconds=10))
    worker = WorkerRecord(
        job="train", host="node1", state="running", pids=(4100,), gpus=(1,), idle_since=idle_since
    )
    store = open_store(url)
    try:
        store.put(layout.workers("node1", "train"), worker.to_json())
        store.put(layout.agent("node1"), agent.to_json(), lease=store.grant_lease(60))
    finally:
        store.close()


def test_queue_api_and_status_show_a_waiting_request(served: Served) -> None:
    assert served.cli("set", "job=train", "gpus=1", "host=node1").code == 0
    with served.waiting_set("job=late", "gpus=1", "host=node1"):

        def listed() -> list[Any] | None:
            code, body, _ = served.get("/api/v1/queue")
            queue: list[Any] = json.loads(body)["queue"] if code == 200 else []
            return queue or None

        (entry,) = wait_for("the API to list the waiter", listed)
        assert entry["job"] == "late" and entry["position"] == 1
        assert "held by job 'train'" in entry["why"]
        assert json.loads(served.cli("queue", "-o", "json").out)["queue"] == [entry]
        assert json.loads(served.cli("status", "-o", "json").out)["queue"] == [entry]
        assert "waiting #1 late" in served.cli("status").out


def test_usage_api_answers_what_the_cli_prints_and_the_page_shows_the_top_users(
    served: Served,
) -> None:
    from playwright.sync_api import sync_playwright

    assert served.cli("set", "job=train", "gpus=1,2", "host=node1").code == 0
    held_from = time.time()
    # History says when to the second: hold past the next whole second so it counts.
    wait_for("the clock to pass a second", lambda: time.time() >= int(held_from) + 2)
    assert served.cli("release", "job=train").code == 0
    assert served.cli("set", "job=eval", "gpus=0", "host=node2").code == 0
    printed = json.loads(served.cli("usage", "--by", "job", "-o", "json").out)
    code, body, _ = served.get("/api/v1/usage?by=job&since=30d")
    answered = json.loads(body)
    assert code == 200 and {r["key"] for r in answered["rows"]} == {"train", "eval"}
    # Both read the same history: the ended holding is the same; the open one has grown.
    api_rows = {r["key"]: r for r in answered["rows"]}
    cli_rows = {r["key"]: r for r in printed["rows"]}
    assert api_rows["train"] == cli_rows["train"] and api_rows["train"]["gpu_hours"] > 0
    assert api_rows["eval"]["holdings"] == cli_rows["eval"]["holdings"] == 1
    assert served.get("/api/v1/usage?by=colour")[0] == 400
    assert served.get("/api/v1/usage?limit=0")[0] == 400

    assert served.get("/api/v1/usage?jobs=all")[0] == 400
    counted = json.loads(served.get("/api/v1/usage?by=user&since=7d&jobs=count")[1])["rows"][0]
    user = counted["key"]
    assert counted["job_count"] == 2 and "jobs" not in counted  # eval and train, not named
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(served.base + "/")
        row = page.wait_for_selector(f'#top-users tr[data-holder="{user}"]')
        assert row is not None and row.inner_text().split("\t")[-1] == "2"
        browser.close()
