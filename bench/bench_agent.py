"""The host agent: how fast a move reaches the worker, and what the agent costs.

For SQLite and a real etcd (started here), with a fake-NVML host of 4 GPUs:

* moves: ``allocator set job=train gpus=N`` alternating between GPUs 0 and 1,
  ``--moves`` times; measured from the CLI process returning to the new
  worker's first line of Python running (its report file written; this
  includes the worker interpreter's own start-up, shown as a baseline:
  ``python -c pass``);
* the agent's resident memory after the moves;
* the agent's CPU use over ``--idle`` seconds with nothing happening, and over
  the same time with etcd stopped (it must not spin while the store is down).

Usage: ``python bench/bench_agent.py [--moves 50] [--idle 60]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.agent_harness import AgentHarness, agent_policy, pid_alive  # noqa: E402
from tests.support.etcd_server import EtcdServer  # noqa: E402

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


def measure_moves(world: AgentHarness, moves: int) -> list[float]:
    """Seconds from each ``set`` returning to the new worker running."""
    assert world.cli("set", "job=train", "gpus=1").code == 0
    pid = world.new_report("train")["pid"]
    samples = []
    for i in range(moves):
        result = world.cli("set", "job=train", f"gpus={i % 2}")
        returned = time.monotonic()
        assert result.code == 0, result.err
        while True:
            report = world.report("train")
            if report and report["pid"] != pid and pid_alive(report["pid"]):
                break
            time.sleep(0.001)
        samples.append(time.monotonic() - returned)
        pid = report["pid"]
    return samples


def python_startup() -> float:
    """Median seconds of ``python -c pass`` (the worker interpreter's floor)."""
    runs = []
    for _ in range(10):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        runs.append(time.monotonic() - started)
    return statistics.median(runs)


def report_moves(name: str, samples: list[float], floor: float) -> None:
    """Print median and worst of the move latencies."""
    median, worst = statistics.median(samples), max(samples)
    print(
        f"  {name:<7} moves={len(samples)}  median {median * 1000:6.1f} ms  "
        f"worst {worst * 1000:6.1f} ms  "
        f"({median / floor:.1f}x python -c pass = {floor * 1000:.0f} ms)"
    )


def run(backend: str, tmp: Path, server: EtcdServer | None, args: argparse.Namespace) -> None:
    """Moves, memory and CPU for one backend."""
    url = server.url if server is not None else f"sqlite://{tmp / 'bench.db'}"
    (tmp / f"agent-{backend}").mkdir()
    world = AgentHarness(tmp / f"agent-{backend}", url, f"/bench-{uuid.uuid4().hex[:8]}")
    try:
        policy = agent_policy(world.workdir)
        policy["health"] = {"interval_seconds": 5}  # the default, as deployed
        world.apply_policy(policy)
        world.start_agent()
        samples = measure_moves(world, args.moves)
        report_moves(backend, samples, args.floor)
        assert world.process is not None
        pid = world.process.pid
        print(f"  {backend:<7} agent RSS {rss_mib(pid):.1f} MiB")
        idle = cpu_percent_over(pid, args.idle)
        print(f"  {backend:<7} agent CPU idle ({args.idle:.0f} s): {idle:.2f}%")
        if server is not None:
            server.stop()
            down = cpu_percent_over(pid, args.idle)
            print(f"  {backend:<7} agent CPU with etcd down ({args.idle:.0f} s): {down:.2f}%")
            server.restart()
        world.stop_agent()
    finally:
        world.cleanup()


def main() -> None:
    """Run the agent benchmark on SQLite and etcd."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--moves", type=int, default=50)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    args.floor = python_startup()
    with tempfile.TemporaryDirectory() as tmp:
        print("agent: set returning -> new worker running; resident memory; CPU")
        run("sqlite", Path(tmp), None, args)
        server = EtcdServer(Path(tmp) / "etcd")
        server.start()
        try:
            run("etcd", Path(tmp), server, args)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
