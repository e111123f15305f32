"""The host agent: how fast a move reaches the worker, and what the agent costs.

For SQLite and a real etcd (started here), with a fake-NVML host:

* propagation: ``allocator set job=train gpus=N`` alternating between GPUs
  0 and 1, ``moves`` times, from the CLI process returning to the moved
  worker's first line of Python running with its new environment (its
  report file written). Baseline, interleaved with ours: a bare watch (on
  etcd a bare JSON-gateway client, :mod:`bench.bare_etcd`; on SQLite the
  store's watch, which has no other) seeing a write, then a bare
  ``subprocess`` spawn of the same worker command, to the same report file.
  Judged on the median and on the worst move;
* queue hand-off (:mod:`bench.bench_queue`): a release to the next waiter's
  worker running, against the same floor;
* preemption hand-off (:mod:`bench.bench_preempt`): a normal waiter taking a
  GPU back from a preemptible ``run``, within its grace and twice the floor;
* footprint: the agent's resident memory while it supervises 8 workers;
* CPU: the agent's CPU use over ``idle`` seconds with nothing happening
  (SQLite and etcd), and as long with etcd stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from allocator.store import Store, open_store
from bench.common import Row, ratio_row, value_row
from tests.e2e.agent_harness import DUMMY, AgentHarness, agent_policy, pid_alive
from tests.support.etcd_server import EtcdServer

__all__ = ["cpu_percent_over", "rows", "rss_mib", "wait_new_worker"]

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_percent_over(pid: int, seconds: float) -> float:
    """Average CPU use of ``pid`` (percent of one core) over ``seconds``."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)  # a measurement window, not a wait for a condition
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - started)


def _report(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data


def wait_new_worker(path: Path, old_pid: int | None, deadline_s: float = 30.0) -> int:
    """Poll (every millisecond) until a live worker other than ``old_pid`` has reported."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        report = _report(path)
        if report and report["pid"] != old_pid and pid_alive(report["pid"]):
            return int(report["pid"])
        time.sleep(0.001)
    raise SystemExit(f"no new worker reported in {path} within {deadline_s} s")


# --- ours: the agent -------------------------------------------------------------------


def _move(world: AgentHarness, gpu: int, old_pid: int) -> tuple[float, int]:
    result = world.cli("set", "job=train", f"gpus={gpu}")
    returned = time.monotonic()
    if result.code != 0:
        raise SystemExit(f"allocator set failed: {result.err}")
    pid = wait_new_worker(world.workdir / "train.json", old_pid)
    return time.monotonic() - returned, pid


# --- the baseline: a bare watch and a bare spawn ------------------------------------------


class BareWatch:
    """A write, a bare watcher seeing it, a bare spawn of the worker: the floor of a move."""

    def __init__(self, url: str, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.out = workdir / "bare.json"
        self.env = env
        self.command = [sys.executable, str(DUMMY), "--out", str(self.out)]
        self.etcd = url.startswith("etcd")
        self._url = url
        self._store: Store | None = None
        self._seen = threading.Event()

    @contextmanager
    def running(self) -> Iterator[Callable[[], float]]:
        """A callable that makes one move and returns its seconds."""
        if self.etcd:
            with self._etcd() as move:
                yield move
        else:
            with self._sqlite() as move:
                yield move

    def _spawn_and_wait(self, wrote: float) -> float:
        worker = subprocess.Popen(
            self.command,
            env=self.env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_new_worker(self.out, None)
        elapsed = time.monotonic() - wrote
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        self.out.unlink(missing_ok=True)
        return elapsed

    @contextmanager
    def _etcd(self) -> Iterator[Callable[[], float]]:
        from bench.bare_etcd import BareEtcd

        client = BareEtcd(self._url.split("://", 1)[1].split(",")[0])
        batches = client.watch(b"/bare/")

        def move() -> float:
            client.put(b"/bare/k", uuid.uuid4().bytes)
            wrote = time.monotonic()
            while not next(batches):
                pass
            return self._spawn_and_wait(wrote)

        try:
            yield move
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            client.close()

    @contextmanager
    def _sqlite(self) -> Iterator[Callable[[], float]]:
        store = open_store(self._url)
        watcher = open_store(self._url)
        watch = watcher.watch("/bare/", store.put("/bare/k", b"start") + 1)

        def move() -> float:
            store.put("/bare/k", uuid.uuid4().bytes)
            wrote = time.monotonic()
            while not watch.next(30.0):
                pass
            return self._spawn_and_wait(wrote)

        try:
            yield move
        finally:
            watch.close()
            watcher.close()
            store.close()


def propagation(world: AgentHarness, moves: int, backend: str) -> list[Row]:
    """Moves through the agent interleaved with bare ones; two rows (median, worst)."""
    assert world.cli("set", "job=train", "gpus=1").code == 0
    pid = wait_new_worker(world.workdir / "train.json", None)
    bare = BareWatch(world.store_url, world.workdir, world.env)
    ours: list[float] = []
    floor: list[float] = []
    with bare.running() as bare_move:
        for i in range(moves):
            elapsed, pid = _move(world, i % 2, pid)
            ours.append(elapsed)
            floor.append(bare_move())
        from bench.bench_queue import handoff

        queued = handoff(world, max(2, moves // 2), backend, bare_move, wait_new_worker)
        from bench.bench_preempt import preempt_handoff

        rounds = max(2, moves // 5)
        preempted = preempt_handoff(world, rounds, backend, bare_move, wait_new_worker)

    made = [moves]  # train is on GPU (moves - 1) % 2: each move goes to the other one

    def one_move() -> float:
        nonlocal pid
        elapsed, pid = _move(world, made[0] % 2, pid)
        made[0] += 1
        return elapsed

    from bench.bench_cancel import cancel_to_free

    cancelled = cancel_to_free(world, max(2, moves // 2), backend, one_move, wait_new_worker)
    from bench.bench_submit import submit_to_running

    submitted = submit_to_running(world, max(2, moves // 5), backend, one_move, wait_new_worker)
    return [
        ratio_row(f"propagation, {backend}, median", ours, floor, most=2),
        ratio_row(f"propagation, {backend}, worst", ours, floor, most=4, stat=max),
        queued,
        cancelled,
        submitted,
        preempted,
    ]


def footprint(world: AgentHarness, backend: str) -> Row:
    """The agent's RSS while it supervises 8 workers (8 single-GPU jobs)."""
    assert world.cli("release", "job=train").code == 0
    for gpu in range(8):
        assert world.cli("set", f"job=w{gpu}", f"gpus={gpu}").code == 0
    for gpu in range(8):
        wait_new_worker(world.workdir / f"w{gpu}.json", None)
    assert world.process is not None
    return value_row(
        f"agent footprint, {backend}, 8 workers", rss_mib(world.process.pid), 60, "MiB"
    )


def _policy(workdir: Path) -> dict[str, Any]:
    policy = agent_policy(workdir, gpus=8)
    policy["health"] = {"interval_seconds": 5}  # the default, as deployed
    for gpu in range(8):
        out = workdir / f"w{gpu}.json"
        command = [sys.executable, str(DUMMY), "--out", str(out)]
        policy["jobs"][f"w{gpu}"] = {"command": command, "grace_seconds": 1}
    from bench.bench_preempt import preempt_jobs
    from bench.bench_queue import queue_jobs

    policy["jobs"].update(queue_jobs(workdir))
    if os.geteuid() == 0:  # root's submitted jobs run as root only where the policy says so
        policy["submit_as_root"] = ["root"]
    policy["jobs"].update(preempt_jobs(workdir))
    return policy


def run_backend(
    backend: str, url: str, work: Path, args: Any, server: EtcdServer | None
) -> list[Row]:
    """Every agent row of one backend."""
    (work / f"agent-{backend}").mkdir()
    world = AgentHarness(work / f"agent-{backend}", url, f"/bench-{uuid.uuid4().hex[:8]}", gpus=8)
    try:
        world.apply_policy(_policy(world.workdir))
        world.start_agent()
        found = propagation(world, args.moves, backend)
        assert world.process is not None
        pid = world.process.pid
        time.sleep(min(2.0, args.idle))  # let the moves' last writes settle first
        idle = cpu_percent_over(pid, args.idle)
        found.append(value_row(f"agent idle CPU, {backend}", idle, 1, "% of a core"))
        if server is not None:
            found.append(footprint(world, backend))
            server.stop()
            down = cpu_percent_over(pid, args.idle)
            found.append(value_row("agent CPU with etcd down", down, 1, "% of a core"))
            server.restart()
        world.stop_agent()
        return found
    finally:
        world.cleanup()


def rows(args: Any, work: Path) -> list[Row]:
    """The agent rows on SQLite, then on a real etcd."""
    found = run_backend("SQLite", f"sqlite://{work / 'agent.db'}", work, args, None)
    server = EtcdServer(work / "etcd-agent")
    server.start()
    try:
        found += run_backend("etcd", server.url, work, args, server)
    finally:
        server.stop()
    return found
