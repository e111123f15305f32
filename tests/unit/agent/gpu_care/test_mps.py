"""The agent's MPS control daemons: one per GPU in use, up before its workers, gone after.

A fake ``nvidia-cuda-mps-control`` (tests/support/fake_mps_control.py) is on
PATH; every daemon is a real process, found by the pid file it writes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.gpu_care.mps import PID_FILE, MpsDaemons, QuitMps, RunMps
from allocator.agent.planning.desired import desired_jobs
from allocator.agent.planning.desired_inputs import DesiredInputs
from allocator.agent.planning.job_phase import Running
from allocator.agent.planning.types import DesiredJob, JobView, Start
from allocator.policy.model import Host, Job, Policy, Pool, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment
from tests.support.fake_mps_control import install_fake_mps
from tests.support.waiting import wait_for

HOST = "node1"
INVENTORY = tuple(GpuInfo(index=i, uuid=f"GPU-{i:04d}", memory_total_mib=1000) for i in range(2))
POLICY = Policy(
    version=1,
    hosts={HOST: Host(HOST, 2, pool="p")},
    pools={"p": Pool("p", (HOST,), sharing=Sharing("mps", 2))},
    jobs={"serve": Job("serve", ("serve",)), "other": Job("other", ("other",))},
)


class World:
    """An MPS directory, the fake control program on PATH, and the events logged."""

    def __init__(self, tmp: Path, path: str) -> None:
        self.root = tmp / "mps"
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.environ = {"PATH": path}
        self.daemons = self.manager()

    def manager(self) -> MpsDaemons:
        return MpsDaemons(self.root, lambda e, f: self.events.append((e, dict(f))), self.environ)

    def desired(self, **gpus: int) -> dict[str, DesiredJob]:
        assignments = {
            job: Assignment(job, HOST, (gpu,), "gpu", "ops", "2026-01-01T00:00:00Z")
            for job, gpu in gpus.items()
        }
        return desired_jobs(
            DesiredInputs(POLICY, HOST, assignments, {}, INVENTORY, {}, {}, mps_dir=str(self.root))
        )

    def gate(
        self, desired: dict[str, DesiredJob], views: dict[str, JobView] | None = None
    ) -> list[Any]:
        starts = [Start(job, want, "new") for job, want in sorted(desired.items())]
        wanted = self.daemons.wanted(desired, views or {}, INVENTORY)
        self.daemons.carry_out(wanted, time.monotonic())
        return self.daemons.hold_starts(starts, desired)

    def pid(self, gpu: int) -> int | None:
        try:
            return int((self.root / f"gpu{gpu}" / "pipe" / PID_FILE).read_text())
        except (OSError, ValueError):
            return None

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.events if name == event]

    def stop_everything(self) -> None:
        self.daemons.stop_all(time.monotonic())  # and reap its helpers
        for gpu in (0, 1):
            pid = self.pid(gpu)
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def view(job: str, alive_workers: int) -> JobView:
    return JobView(job, "f", alive_workers, Running(0.0), (None,), 0, 0, (0,))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    path = str(install_fake_mps(tmp_path / "bin")) + os.pathsep + os.environ.get("PATH", "")
    it = World(tmp_path, path)
    try:
        yield it
    finally:
        it.stop_everything()


def test_a_worker_starts_only_once_its_gpus_daemon_is_up_and_the_daemon_leaves_after_it(
    world: World,
) -> None:
    desired = world.desired(serve=1)
    assert world.gate(desired) == []  # held: the daemon is only being started
    assert world.named("mps-waiting") == [{"job": "serve", "gpus": [1]}]
    released = wait_for("the start to be let through", lambda: world.gate(desired))
    assert [start.job for start in released] == ["serve"]
    pid = world.pid(1)
    assert pid is not None and alive(pid)
    log = (world.root / "gpu1" / "log" / "control.log").read_text()
    (record,) = [json.loads(line) for line in log.splitlines()]
    assert record == {
        "pid": pid,
        "CUDA_VISIBLE_DEVICES": "GPU-0001",
        "CUDA_MPS_PIPE_DIRECTORY": str(world.root / "gpu1" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(world.root / "gpu1" / "log"),
    }
    assert (
        desired["serve"].workers[0].env["CUDA_MPS_PIPE_DIRECTORY"]
        == record["CUDA_MPS_PIPE_DIRECTORY"]
    )
    # The job's workers are still stopping: the daemon stays; once they are gone, it quits.
    world.gate({}, {"serve": view("serve", 1)})
    assert alive(pid)
    wait_for("the daemon to quit", lambda: not world.gate({}, {}) and not alive(pid))
    wait_for(
        "it to be seen off", lambda: world.gate({}, {}) == [] and world.named("mps-daemon-stopped")
    )
    assert world.named("mps-daemon-quit") == [{"gpu": 1, "pid": pid}]
    assert not world.daemons.waiting


def test_two_jobs_on_one_gpu_share_one_daemon(world: World) -> None:
    desired = world.desired(serve=0, other=0)
    wait_for("both starts", lambda: len(world.gate(desired)) == 2)
    assert len(world.named("mps-daemon-start")) == 1
    # One job leaves: the other still uses the daemon.
    world.gate(world.desired(other=0))
    assert world.named("mps-daemon-quit") == []


def test_a_daemon_that_dies_is_started_again(world: World) -> None:
    desired = world.desired(serve=0)
    wait_for("the daemon", lambda: world.gate(desired))
    first = world.pid(0)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(
        "a new daemon",
        lambda: world.gate(desired) and world.pid(0) not in (None, first) and world.pid(0),
    )
    assert world.named("mps-daemon-died") == [{"gpu": 0, "pid": first}]


def test_a_new_agent_keeps_the_daemon_it_finds_and_stops_one_nobody_needs(world: World) -> None:
    wait_for("the daemons", lambda: len(world.gate(world.desired(serve=0, other=1))) == 2)
    kept, unneeded = world.pid(0), world.pid(1)
    world.daemons = world.manager()  # the agent restarted
    assert {e["gpu"] for e in world.named("mps-adopted")} == {0, 1}
    still = world.desired(serve=0)
    assert [s.job for s in world.gate(still)] == ["serve"]  # no wait
    assert unneeded is not None and kept is not None
    wait_for("the unneeded daemon to quit", lambda: world.gate(still) and not alive(unneeded))
    assert alive(kept) and len(world.named("mps-daemon-start")) == 2


def test_a_daemon_that_cannot_start_holds_its_workers_and_is_retried(world: World) -> None:
    (world.root / "gpu0" / "pipe").mkdir(parents=True)
    (world.root / "gpu0" / "pipe" / "FAKE_MPS_FAIL").touch()
    desired = world.desired(serve=0)
    wait_for(
        "a failed start", lambda: world.gate(desired) == [] and world.named("mps-daemon-failed")
    )
    failure = world.named("mps-daemon-failed")[0]
    assert failure["error"] == "nvidia-cuda-mps-control -d exited with 1"
    assert world.daemons.waiting
    (world.root / "gpu0" / "pipe" / "FAKE_MPS_FAIL").unlink()
    wait_for("the retry to bring it up", lambda: world.gate(desired), timeout=10)


def test_no_control_program_is_a_logged_failure_not_a_crash(tmp_path: Path) -> None:
    world = World(tmp_path, str(tmp_path / "empty"))
    assert world.gate(world.desired(serve=0)) == []
    (failure,) = world.named("mps-daemon-failed")
    assert failure["error"].startswith("cannot run nvidia-cuda-mps-control")


def test_stopping_the_agent_tells_every_daemon_to_quit(world: World) -> None:
    wait_for("the daemons", lambda: len(world.gate(world.desired(serve=0, other=1))) == 2)
    pids = [world.pid(0), world.pid(1)]
    world.daemons.stop_all(time.monotonic())
    wait_for("both gone", lambda: not any(alive(pid) for pid in pids if pid))


def test_wanted_only_decides_and_carry_out_acts(world: World) -> None:
    desired = world.desired(serve=0)
    wanted = world.daemons.wanted(desired, {}, INVENTORY)
    assert wanted == [RunMps(0, "GPU-0000")]
    assert world.events == [] and world.pid(0) is None  # nothing started by deciding
    wait_for("the daemon", lambda: world.gate(desired))
    assert world.daemons.wanted({}, {}, INVENTORY) == [QuitMps(0)]  # nobody uses GPU 0
    assert world.pid(0) is not None and not world.named("mps-daemon-quit")
