"""``allocator serve`` over the whole 12,500-host fleet: answers, a change, memory.

A real ``allocator serve`` process reads the scale group's loaded fleet
(:mod:`bench.bench_scale`). Rows:

* ``/api/v1/status`` against ``etcdctl get --prefix -w json`` of the same
  hosts (what any reader of the fleet pays for its bytes): within 1.5x;
* ``/metrics``: at most 100 ms;
* serve's CPU time per one-host change (a put of one assignment, then the
  change seen through ``/api/v1/hosts/H``): at most 50 ms;
* the same with :data:`STREAMS` ``/api/v1/events`` streams open (each
  change sent to every stream): at most 10 ms;
* serve's peak resident memory (``VmHWM``) after all of it: at most 400 MiB.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.store import open_store
from bench.common import Row, clean_env, interleaved, ratio_row, timed_run, value_row
from bench.fleet import host_name, job_name
from tests.support.etcd_server import EtcdServer
from tests.support.serving import ServeProcess

__all__ = ["serve_rows"]

#: One-host changes measured for the CPU row.
CHANGES = 20
#: Event streams open for the streaming CPU row.
STREAMS = 10


class _Serving(ServeProcess):
    """``allocator serve`` on a free loopback port, and its process."""

    def __init__(self, url: str, prefix: str, log: Path) -> None:
        super().__init__(clean_env(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=prefix), log)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            url = f"{self.base}{path}"
            with urllib.request.urlopen(url, timeout=60) as answer:
                return answer.status, answer.read()
        except OSError:
            return 0, b""

    def timed(self, path: str) -> float:
        started = time.perf_counter()
        code, _ = self.get(path)
        elapsed = time.perf_counter() - started
        if code != 200:
            raise SystemExit(f"allocator serve answered {path} with {code}")
        return elapsed

    def wait(self, what: str, probe: Callable[[], bool], timeout: float = 300.0) -> None:
        try:
            self.wait_until(f"allocator serve: {what}", probe, timeout, every=0.01)
        except AssertionError as error:  # a bench run ends with one line, not a traceback
            raise SystemExit(str(error)) from None


def serve_rows(server: EtcdServer, prefix: str, hosts: int, rounds: int, work: Path) -> list[Row]:
    """The serve rows over the ``hosts``-host fleet already loaded under ``prefix``."""
    import psutil

    # The first read is some 40 range requests of 5,000 keys: on a machine busy with
    # the other rows, one of them can take longer than etcd's default 5 s deadline.
    serving = _Serving(f"{server.url}?timeout=60", prefix, work / "serve.log")
    try:
        serving.wait("the fleet", lambda: serving.get("/api/v1/status?per_page=1")[0] == 200)
        layout = KeyLayout(prefix)
        etcdctl = ["etcdctl", "--endpoints", server.endpoint, "get", "--prefix", layout.hosts]
        samples = interleaved(
            {
                "serve": lambda: serving.timed("/api/v1/status"),
                "etcdctl": lambda: timed_run([*etcdctl, "-w", "json"], clean_env()),
                "metrics": lambda: serving.timed("/metrics"),
            },
            rounds,
        )
        cpu = _cpu_per_change(serving, psutil.Process(serving.process.pid), server.url, layout)
        with _Streams(serving.base, STREAMS) as streams:
            streamed = _cpu_per_change(
                serving, psutil.Process(serving.process.pid), server.url, layout, streams.saw
            )
        peak = _peak_rss_mib(serving.process.pid)
    finally:
        serving.close()
    size = f"{hosts:,} hosts"
    return [
        ratio_row(
            f"/api/v1/status vs etcdctl get --prefix -w json, {size}",
            samples["serve"],
            samples["etcdctl"],
            most=1.5,
        ),
        value_row(
            f"/metrics, {size}",
            statistics.median(samples["metrics"]) * 1000,
            100.0,
            "ms",
            samples=len(samples["metrics"]),
        ),
        value_row(
            f"serve CPU per one-host change, {size}", cpu * 1000, 50.0, "ms", samples=CHANGES
        ),
        value_row(
            f"serve CPU per one-host change, {STREAMS} event streams, {size}",
            streamed * 1000,
            10.0,
            "ms",
            samples=CHANGES,
        ),
        value_row(f"serve RSS, {size}", peak, 400.0, "MiB", note="peak (VmHWM)"),
    ]


def _cpu_per_change(
    serving: _Serving,
    process: object,
    url: str,
    layout: KeyLayout,
    sent: Callable[[str], bool] = lambda _reason: True,
) -> float:
    """Serve's CPU seconds per one-host put, each waited for through the host's answer
    (and until ``sent(reason)``: every open event stream got it)."""
    host = host_name(1)
    job = job_name(1, 0)
    store = open_store(url)
    try:
        before = process.cpu_times()  # type: ignore[attr-defined]
        for n in range(CHANGES):
            reason = f"bench change {n}"
            held = Assignment(
                job=job,
                host=host,
                gpus=(0,),
                mode="gpu",
                updated_by="bench@fleet",
                updated_at="2026-11-30T00:00:00Z",
                reason=reason,
            )
            store.put(layout.assignment(host, job), held.to_json())
            serving.wait(
                "the change", lambda r=reason: r.encode() in serving.get(f"/api/v1/hosts/{host}")[1]
            )
            serving.wait("the change on every event stream", lambda r=reason: sent(r))
        after = process.cpu_times()  # type: ignore[attr-defined]
    finally:
        store.close()
    spent = (after.user - before.user) + (after.system - before.system)
    return float(spent / CHANGES)


class _Streams:
    """``count`` open ``/api/v1/events`` streams, each read to its end by a thread."""

    def __init__(self, base: str, count: int) -> None:
        self._base = base
        self._count = count
        self._answers: list[Any] = []
        self._threads: list[threading.Thread] = []
        #: Each stream's last ``data:`` line.
        self.last: list[bytes] = []

    def __enter__(self) -> _Streams:
        for _ in range(self._count):  # one snapshot at a time: each is the whole fleet
            answer = urllib.request.urlopen(f"{self._base}/api/v1/events", timeout=600)
            while answer.readline().strip():  # the snapshot, to its blank line
                pass
            self._answers.append(answer)
            self.last.append(b"")
            args = (answer, self.last, len(self.last) - 1)
            thread = threading.Thread(target=_drain, args=args, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def saw(self, text: str) -> bool:
        """Whether every stream's last event holds ``text``."""
        return all(text.encode() in line for line in self.last)

    def __exit__(self, *_exc: object) -> None:
        for answer in self._answers:
            with contextlib.suppress(OSError, AttributeError):
                answer.fp.raw._sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(10)


def _drain(answer: Any, last: list[bytes], index: int) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        while line := answer.readline():
            if line.startswith(b"data: "):
                last[index] = line


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    """Load a fleet of ``argv[1]`` hosts (default 12,500) and print the serve rows."""
    import tempfile

    from bench.fleet import load_fleet
    from bench.run import format_table

    hosts = int(sys.argv[1]) if len(sys.argv) > 1 else 12_500
    with tempfile.TemporaryDirectory() as tmp:
        server = EtcdServer(Path(tmp) / "etcd")
        server.start()
        try:
            store = open_store(server.url)
            try:
                load_fleet(store, "/serve", hosts=hosts)
            finally:
                store.close()
            print(format_table(serve_rows(server, "/serve", hosts, 5, Path(tmp))))
        finally:
            server.stop()


if __name__ == "__main__":
    main()


#: What the page asks for when it is opened (``serve/static/page.js``), its usage
#: panel under both windows the user can pick.
PAGE_OPEN = (
    "/",
    "/api/v1/summary",
    "/api/v1/queue",
    "/api/v1/status?per_page=1",
    "/api/v1/status?state=idle&per_page=10",
    "/api/v1/free?limit=20",
    "/api/v1/broken?limit=20",
    "/api/v1/usage?jobs=count&limit=10&since=7d&by=user",
    "/api/v1/usage?jobs=count&limit=10&since=7d&by=team",
    "/api/v1/usage?jobs=count&limit=10&since=24h&by=user",
    "/api/v1/usage?jobs=count&limit=10&since=24h&by=team",
    "/api/v1/series",
    "/api/v1/history?limit=50",
)


def page_open_rss(url: str, prefix: str, hosts: int, work: Path) -> float:
    """Serve's peak RSS (MiB) once the page is open on ``hosts`` hosts: its stream and panels."""
    serving = _Serving(f"{url}", prefix, work / "serve-page.log")
    try:
        serving.wait(
            "the fleet",
            lambda: serving.get("/api/v1/status?per_page=1")[0] == 200,
        )
        with _Streams(serving.base, 1):
            for path in PAGE_OPEN:
                code, _ = serving.get(path)
                if code != 200:
                    raise SystemExit(f"allocator serve answered {path} with {code}")
            return _peak_rss_mib(serving.process.pid)
    finally:
        serving.close()
