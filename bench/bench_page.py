"""The status page at fleet size: how soon a browser shows the whole heatmap.

A SQLite store holds the simulated busy fleet (:func:`bench.fleet.write_busy_fleet`,
25,000 hosts x 8 GPUs in full and quick runs: the scale group's large fleet),
a real ``allocator serve`` reads it, and Debian's chromium (driven by
playwright) opens the page a few times. The page marks when its first whole
heatmap is on screen (``data-first-draw-ms`` on the canvas, milliseconds since
navigation): the row is the median, judged on its own against the goal of
2 s. A second row is the page's height once drawn, in screens of 900 px: it
stays within a few at any fleet size (the suite checks it at 12,500 hosts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import Row, clean_env, spread, value_row
from bench.fleet import write_busy_fleet

__all__ = ["FIRST_DRAW_MS", "SCREENS", "rows"]

#: The page of a 12,500-host fleet is usable within this of being opened.
FIRST_DRAW_MS = 2000.0
#: Screens of 1280 x 900 the page may take, whatever the fleet's size.
SCREENS = 4
_VIEWPORT = {"width": 1280, "height": 900}
_PREFIX = "/bench-page"


def rows(args: argparse.Namespace, work: Path) -> list[Row]:
    """The first-draw row at ``args.large`` hosts, ``args.rounds`` page loads (3 to 5)."""
    hosts = args.large
    url = f"sqlite://{work / 'page-fleet.db'}"
    write_busy_fleet(url, _PREFIX, hosts)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = subprocess.Popen(
        [sys.executable, "-m", "allocator", "serve", "--listen", f"127.0.0.1:{port}"],
        env=clean_env(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=_PREFIX),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_fleet(base, hosts, serve)
        samples, height = _first_draws(base, max(3, min(args.rounds, 5)))
    finally:
        serve.terminate()
        serve.wait(30)
    median = statistics.median(samples)
    row = value_row(
        f"page: first whole heatmap, {hosts:,} hosts",
        median,
        FIRST_DRAW_MS,
        "ms",
        samples=len(samples),
        note=f"{hosts * 8:,} cells; chromium 1280x900, ms from navigation",
    )
    row.spread = {"ours": spread(samples)}
    screens = value_row(
        f"page: height, {hosts:,} hosts",
        height / _VIEWPORT["height"],
        float(SCREENS),
        "screens",
        note=f"{height:,} px at 1280x900 once drawn",
    )
    return [row, screens]


def _wait_for_fleet(base: str, hosts: int, serve: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            raise RuntimeError(f"allocator serve exited with {serve.returncode}")
        try:
            with urllib.request.urlopen(base + "/api/v1/fleet", timeout=30) as answer:
                if len(json.loads(answer.read())["hosts"]) == hosts:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("allocator serve did not show the whole fleet in 300 s")


def _first_draws(base: str, loads: int) -> tuple[list[float], int]:
    """Each load's first whole heatmap (ms from navigation), and the page's height in px."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    samples, height = [], 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for _ in range(loads):
                page = browser.new_page(viewport=_VIEWPORT)
                page.goto(base + "/")
                page.wait_for_selector("#heatmap[data-first-draw-ms]", timeout=120_000)
                samples.append(float(page.get_attribute("#heatmap", "data-first-draw-ms") or 0))
                height = int(page.evaluate("document.documentElement.scrollHeight"))
                page.close()
        finally:
            browser.close()
    return samples, height
