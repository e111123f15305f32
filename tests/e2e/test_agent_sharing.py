"""A real agent with shared GPUs: MPS slots, one daemon per GPU, workers pinned to their CPUs.

The host has 2 fake GPUs, GPU 0 local to CPU 0 (NUMA node 0) and GPU 1 to
CPU 1 (node 1), in a pool of MPS with 2 slots per GPU. A fake
``nvidia-cuda-mps-control`` and a fake ``numactl`` (which records its
arguments, then runs the worker) are on the agent's PATH.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness, _job, pid_alive
from tests.support.fake_mps_control import install_fake_mps
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
    reason="needs CPUs 0 and 1",
)

NUMACTL = """\
#!{python}
import os, sys
with open({record!r}, "a") as out:
    out.write(" ".join(sys.argv[1:3]) + "\\n")
command = sys.argv[sys.argv.index("--") + 1:]
os.execv(command[0], command)
"""


@pytest.fixture
def world(tmp_path: Path, prefix: str) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix, gpus=2)
    harness.gpus.update(0, numa_node=0, cpu_affinity="0", memory_total_mib=1000)
    harness.gpus.update(
        1, numa_node=1, cpu_affinity="1", memory_total_mib=1000, pcie={"0": "system"}
    )
    try:
        yield harness
    finally:
        harness.cleanup()


def _tools(world: AgentHarness) -> str:
    tools = install_fake_mps(world.workdir / "bin")
    numactl = tools / "numactl"
    numactl.write_text(NUMACTL.format(python=sys.executable, record=str(world.workdir / "numactl")))
    numactl.chmod(0o755)
    return f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"


def _policy(world: AgentHarness) -> dict[str, Any]:
    return {
        "version": 1,
        "visible_devices": "uuid",
        "hosts": {HOST: {"gpus": 2}},
        "pools": {"shared": {"hosts": [HOST], "sharing": {"mode": "mps", "slots": 2}}},
        "jobs": {name: _job(name, world.workdir) for name in ("a", "b", "c")},
    }


def _daemon_pid(world: AgentHarness, gpu: int) -> int | None:
    try:
        text = (
            world.workdir / "agent" / "mps" / f"gpu{gpu}" / "pipe" / "nvidia-cuda-mps-control.pid"
        )
        return int(text.read_text())
    except (OSError, ValueError):
        return None


def test_two_jobs_share_a_gpu_through_one_mps_daemon_pinned_to_its_cpu(world: AgentHarness) -> None:
    world.apply_policy(_policy(world))
    world.start_agent(env={"PATH": _tools(world)})
    assert world.cli("set", "job=a", "gpus=0").code == 0
    assert world.cli("set", "job=b", "gpus=0").code == 0
    a, b = world.new_report("a"), world.new_report("b")
    for report in (a, b):
        env = report["env"]
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(world.workdir / "agent/mps/gpu0/pipe")
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=500M"
        assert env["ALLOCATOR_GPU_MEMORY_FRACTION"] == "0.5"
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-00000000-0000-4000-8000-000000000000"
        assert os.sched_getaffinity(report["pid"]) == {0}
    # One daemon for GPU 0, with only that GPU visible, up before either worker started.
    (daemon,) = [
        json.loads(line)
        for line in (world.workdir / "agent/mps/gpu0/log/control.log").read_text().splitlines()
    ]
    assert daemon["CUDA_VISIBLE_DEVICES"] == "GPU-00000000-0000-4000-8000-000000000000"
    order = [
        e["event"] for e in world.log_events() if e["event"] == "mps-daemon-up" or e.get("job")
    ]
    assert order.index("mps-daemon-up") < order.index("start")
    assert (world.workdir / "numactl").read_text().splitlines() == ["--membind=0 --"] * 2

    status = world.cli("status", "-o", "json")
    row = json.loads(status.out)["hosts"][0]["gpus"][0]
    assert (row["holder"], row["slots"]) == ("a,b", "2/2 slots")
    full = world.cli("set", "job=c", "gpus=0")
    assert full.code == 3 and "2 of 2 slots in use, 1 asked" in full.err

    placed = world.cli("set", "job=c", "count=1")
    assert placed.code == 0 and "picked 1: " in placed.err
    c = world.new_report("c")
    assert os.sched_getaffinity(c["pid"]) == {1}
    first = wait_for("GPU 0's daemon", lambda: _daemon_pid(world, 0))
    second = wait_for("GPU 1's daemon", lambda: _daemon_pid(world, 1))

    for job in ("a", "b"):
        assert world.cli("release", f"job={job}").code == 0
    wait_for("GPU 0's daemon to quit", lambda: not pid_alive(first))
    assert pid_alive(second) and pid_alive(c["pid"])  # GPU 1 still has its job
    assert not pid_alive(a["pid"]) and not pid_alive(b["pid"])
