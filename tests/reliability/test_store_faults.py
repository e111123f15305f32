"""The store goes away under a running agent: crashed, frozen, restarted, while assignments change.

A real agent supervises two jobs on a fake 4-GPU host: ``train`` is
assigned once and never touched, ``waiter`` is moved every cycle. Each
cycle moves ``waiter`` (and sees it run there), takes the store away
(etcd: SIGKILL and a restart on the same data and ports, or SIGSTOP for
1-5 s; the Consul double: stopped and restarted on the same port), and
moves ``waiter`` to another GPU as soon as the store is back. Then:

* no worker dies because of the outage: ``train`` keeps its one process
  from start to end;
* the agent converges within 5 s of the store's return: ``waiter`` runs
  on the GPU written last, as a single live process;
* no update is lost: at the end the agent runs exactly what the store says.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness, pid_alive
from tests.reliability.conftest import Figures, scale
from tests.support.consul_double import ConsulDouble
from tests.support.etcd_server import EtcdServer
from tests.support.waiting import wait_for

#: The agent must run the last assignment written within this long of the store's return.
CONVERGE_S = 5.0


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


class Outages:
    """Takes one store away and brings it back, in the ways a test cycles through."""

    def __init__(self, kinds: list[tuple[str, Callable[[float], None]]]) -> None:
        self.kinds = kinds

    def inflict(self, cycle: int, rng: random.Random) -> str:
        """Run outage number ``cycle`` (whole: the store is back on return); name it."""
        name, outage = self.kinds[cycle % len(self.kinds)]
        outage(rng.uniform(1.0, 5.0) if scale(0, 1) else 1.0)
        return name


def _etcd_outages(server: EtcdServer) -> Outages:
    def crash(_: float) -> None:
        server.kill()
        server.restart()  # same data directory, same ports

    def freeze(seconds: float) -> None:
        server.pause()
        try:
            time.sleep(seconds)  # the outage itself, not a wait for something
        finally:
            server.resume()

    return Outages([("etcd SIGKILL + restart", crash), ("etcd SIGSTOP", freeze)])


def _consul_outages(double: ConsulDouble) -> Outages:
    def stop(seconds: float) -> None:
        port = int(double.address.rsplit(":", 1)[1])
        double.stop()
        try:
            time.sleep(seconds)  # the outage itself
        finally:
            double.start(port)

    return Outages([("Consul stopped + restarted", stop)])


@pytest.fixture(params=["etcd", "consul"])
def store_under_fault(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, Outages]]:
    """A store of the test's own (URL), and how to take it away."""
    if request.param == "etcd":
        server = EtcdServer(tmp_path / "etcd")
        server.start()
        try:
            yield server.url, _etcd_outages(server)
        finally:
            server.stop()
    else:
        double = ConsulDouble()
        double.start()
        try:
            yield double.url, _consul_outages(double)
        finally:
            double.stop()


def _running(world: AgentHarness, job: str, gpu: int) -> dict[str, Any] | None:
    """The report of ``job``'s live worker if it runs on ``gpu``."""
    report = world.report(job)
    if report and pid_alive(report["pid"]) and report["env"]["CUDA_VISIBLE_DEVICES"] == _uuid(gpu):
        return report
    return None


@pytest.mark.slow
def test_store_outages_kill_no_worker_lose_no_update_and_converge_quickly(
    tmp_path: Path, prefix: str, store_under_fault: tuple[str, Outages], figures: Figures
) -> None:
    url, outages = store_under_fault
    world = AgentHarness(tmp_path, url, prefix)
    rng = random.Random(9)
    try:
        world.apply_policy()
        world.start_agent()
        assert world.cli("set", "job=train", "gpus=0").code == 0
        assert world.cli("set", "job=waiter", "gpus=1").code == 0
        train = wait_for("train on GPU 0", lambda: _running(world, "train", 0))
        waiter = wait_for("waiter on GPU 1", lambda: _running(world, "waiter", 1))
        cycles, worst, kinds = scale(2, 20), 0.0, set()
        for cycle in range(cycles):
            # Each move goes to the next of GPUs 1-3 (0 is train's): always one to make.
            before, after = 1 + (2 * cycle + 1) % 3, 1 + (2 * cycle + 2) % 3
            assert world.cli("set", "job=waiter", f"gpus={before}").code == 0
            wait_for(
                f"cycle {cycle}: waiter on GPU {before} before the outage",
                lambda before=before: _running(world, "waiter", before),
            )
            kinds.add(outages.inflict(cycle, rng))
            back = time.monotonic()
            moved = world.cli("set", "job=waiter", f"gpus={after}")
            assert moved.code == 0, moved.err
            waiter = wait_for(
                f"cycle {cycle}: waiter on GPU {after} after the store came back",
                lambda after=after: _running(world, "waiter", after),
                timeout=max(CONVERGE_S - (time.monotonic() - back), 0.1),
            )
            worst = max(worst, time.monotonic() - back)
            assert world.report("train") == train and pid_alive(train["pid"]), "train restarted"
        assert world.process is not None and world.process.poll() is None, world.log_text()

        def published() -> bool:  # what the agent reports agrees with what runs
            record = world.worker_record("waiter")
            return record is not None and record.pids == (waiter["pid"],)

        wait_for("the agent to report waiter's new worker", published)
        figures.add("cycles", cycles)
        figures.add("outages", ", ".join(sorted(kinds)))
        figures.add("worst convergence after the store returned (s)", round(worst, 2))
        figures.add("workers lost", 0)
    finally:
        world.cleanup()
