"""``allocator run`` starts its command only once the GPU's previous worker is gone.

A released job's worker that takes seconds to stop (a long stop grace, a
slow checkpoint on SIGTERM) still runs on its GPU after the store says the
GPU is free; ``run`` on that GPU waits for it, saying so, on SQLite and etcd.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness
from tests.support.waiting import wait_for

#: A worker that takes two seconds to stop after SIGTERM, and says when it ended.
SLOW_STOPPER = """
import signal, sys, time
journal = sys.argv[1]
def stop(*_):
    time.sleep(2.0)
    open(journal, "a").write(f"worker-end {time.time()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(journal, "a").write(f"worker-start {time.time()}\\n")
while True:
    signal.pause()
"""
#: The run's command: says when it started.
RUN_COMMAND = "import sys, time; open(sys.argv[1], 'a').write(f'run-start {time.time()}\\n')"


@pytest.fixture(params=["sqlite", "etcd"])
def world(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    if request.param == "etcd":
        url = str(request.getfixturevalue("etcd_server").url)
    else:
        url = f"sqlite://{tmp_path / 'store.db'}"
    harness = AgentHarness(tmp_path, url, prefix, gpus=1)
    journal = tmp_path / "journal"
    policy = {
        "version": 1,
        "hosts": {HOST: {"gpus": 1}},
        "jobs": {
            "slow": {
                "command": [sys.executable, "-c", SLOW_STOPPER, str(journal)],
                "grace_seconds": 10,
            },
            "next": {"command": [sys.executable, "-c", RUN_COMMAND, str(journal)]},
        },
    }
    with harness.running(policy=policy):
        yield harness


def _times(journal: Path, event: str) -> list[float]:
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [float(line.split()[1]) for line in lines if line.split()[0] == event]


def test_run_starts_only_once_the_released_jobs_slow_worker_stopped(
    world: AgentHarness, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    assert world.cli("set", "job=slow", "gpus=0").code == 0
    wait_for("slow's worker to start", lambda: _times(journal, "worker-start"))
    wait_for("the agent to publish it", lambda: _state(world) == "running")
    assert world.cli("release", "job=slow").code == 0
    ran = world.cli(
        "run", "job=r1", f"host={HOST}", "gpus=0", "--",
        sys.executable, "-c", RUN_COMMAND, str(journal),
    )  # fmt: skip
    assert ran.code == 0, ran.err
    ended, started = _times(journal, "worker-end"), _times(journal, "run-start")
    assert ended, "run's command ran and ended while slow's worker still ran"
    assert started[0] >= ended[0], f"run's command started {ended[0] - started[0]:.2f}s early"
    assert "waiting for slow's worker on GPU 0 to stop" in ran.err


def test_run_gives_up_with_exit_3_when_the_worker_outlasts_its_wait(
    world: AgentHarness, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    assert world.cli("set", "job=slow", "gpus=0").code == 0
    wait_for("the agent to publish slow's worker", lambda: _state(world) == "running")
    assert world.cli("release", "job=slow").code == 0
    ran = world.cli(
        "run", "job=r1", f"host={HOST}", "gpus=0", "--wait=0s", "--",
        sys.executable, "-c", RUN_COMMAND, str(journal),
    )  # fmt: skip
    assert ran.code == 3, ran.err
    assert "slow's worker on GPU 0" in ran.err and "Traceback" not in ran.err
    assert _times(journal, "run-start") == []
    wait_for(
        "the GPU to be free again", lambda: world.cli("status", "-o", "json").out.count('"r1"') == 0
    )


def test_the_agents_next_worker_on_the_gpu_starts_only_once_the_released_one_stopped(
    world: AgentHarness, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    assert world.cli("set", "job=slow", "gpus=0").code == 0
    wait_for("the agent to publish slow's worker", lambda: _state(world) == "running")
    assert world.cli("release", "job=slow").code == 0
    assert world.cli("set", "job=next", "gpus=0").code == 0
    started = wait_for("next's worker to start", lambda: _times(journal, "run-start"), timeout=20)
    ended = _times(journal, "worker-end")
    assert ended, "next's worker started while slow's worker still ran"
    assert started[0] >= ended[0]


def test_run_waits_for_a_process_an_ended_holding_left_on_its_gpu(
    tmp_path: Path, prefix: str
) -> None:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix, gpus=2)
    with harness.running(start=False):  # no agent: nobody stops the leftover
        leftover = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.pause()"],
            env={
                **harness.env,
                "ALLOCATOR_HOLDING": f"{prefix}:old@{HOST}/1.1",
                "ALLOCATOR_GPUS": "0",
            },
        )
        try:
            busy = harness.cli("run", "job=r1", f"host={HOST}", "gpus=0", "--wait=1s", "--", "true")
            assert busy.code == 3, busy.err
            assert "old's ended holding's processes on GPU 0" in busy.err
            other = harness.cli("run", "job=r2", f"host={HOST}", "gpus=1", "--", "true")
            assert other.code == 0, other.err
        finally:
            leftover.kill()
            leftover.wait(10)
        ran = harness.cli("run", "job=r1", f"host={HOST}", "gpus=0", "--", "true")
        assert ran.code == 0, ran.err


def test_lease_waits_for_a_process_an_ended_holding_left_and_gives_up_in_time(
    tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import allocator
    from allocator.errors import ConflictError

    monkeypatch.setenv("ALLOCATOR_HOST", HOST)  # the harness's host is this machine
    url = f"sqlite://{tmp_path / 'store.db'}"
    harness = AgentHarness(tmp_path, url, prefix, gpus=1)
    with harness.running(start=False):
        leftover = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.pause()"],
            env={
                **harness.env,
                "ALLOCATOR_HOLDING": f"{prefix}:old@{HOST}/1.1",
                "ALLOCATOR_GPUS": "0",
            },
        )
        try:
            refused = pytest.raises(ConflictError, match="old's ended holding's processes on GPU 0")
            with refused, allocator.lease(gpus=[0], host=HOST, wait=1, store=url, prefix=prefix):
                pytest.fail("the lease began while the leftover ran on its GPU")
            assert "waiting for old's ended holding's processes" in capsys.readouterr().err
        finally:
            leftover.kill()
            leftover.wait(10)
        # It let the GPU go: with the leftover gone, the next lease gets it at once.
        with allocator.lease(gpus=[0], host=HOST, store=url, prefix=prefix) as grant:
            assert grant.gpus == (0,)


def _state(world: AgentHarness) -> str | None:
    record = world.worker_record("slow")
    return None if record is None else record.state
