"""Workers in containers under a real podman: devices by CDI, adoption, fallback, stop.

Marked ``container``: ``pytest -m container`` selects them. They need podman
and busybox-static (``tools/install-test-servers``) and root (CDI specs live
in /var/run/cdi); elsewhere they are skipped. Each worker is busybox's ``sh``
in a container of an image imported from a busybox root file system; it
writes what it sees (its environment, its /dev) to a mounted folder, named
after its container, and notes a SIGTERM before it exits.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import HOST, AgentHarness
from tests.support.podman import Podman, cdi_spec, fake_uuid, podman_or_skip
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.container]

_SCRIPT = (
    "trap 'echo term > /out/$(hostname).term; exit 3' TERM; "
    "env > /out/$(hostname).env.tmp; ls /dev > /out/$(hostname).dev; "
    "mv /out/$(hostname).env.tmp /out/$(hostname).env; "
    "while :; do sleep 0.05; done"
)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman and CDI specs under /var/run/cdi")
    yield from podman_or_skip(tmp_path_factory.mktemp("podman"))


@pytest.fixture
def world(tmp_path: Path, prefix: str, podman: Podman) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    (tmp_path / "out").mkdir()
    try:
        with cdi_spec(range(4)):
            yield harness
    finally:
        harness.cleanup()
        for found in podman.containers(f"label=allocator.job=box-{prefix.strip('/')[-8:]}"):
            podman.run("rm", "-f", str(found["Id"]), check=False)


def _policy(
    world: AgentHarness, podman: Podman, job: str, args: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "version": 1,
        "hosts": {HOST: {"gpus": 4}},
        "jobs": {
            job: {
                "command": ["/bin/sh", "-c", _SCRIPT],
                "grace_seconds": 5,
                "fallback": "cpu-1",
                "env": {"TRAINING_RUN": "seven"},
                "container": {
                    "image": podman.image,
                    "engine": "podman",
                    "mounts": [f"{world.workdir / 'out'}:/out"],
                    "args": list(args),
                },
            }
        },
        "fallback": {"cpu-1": {"action": "cpu", "threads": 1}},
        "health": {"interval_seconds": 0.2, "hold_down_seconds": 0.5},
    }


def _reports(world: AgentHarness) -> dict[str, dict[str, Any]]:
    """What each container wrote, by container: its environment and its /dev."""
    out = world.workdir / "out"
    found = {}
    for env_file in out.glob("*.env"):
        name = env_file.name[: -len(".env")]
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        dev = (out / f"{name}.dev").read_text().split()
        found[name] = {"env": env, "dev": dev, "term": (out / f"{name}.term").exists()}
    return found


def _new_report(world: AgentHarness, seen: set[str]) -> tuple[str, dict[str, Any]]:
    def fresh() -> tuple[str, dict[str, Any]] | None:
        new = {k: v for k, v in _reports(world).items() if k not in seen}
        return next(iter(new.items())) if new else None

    name, report = wait_for("a new container's report", fresh, timeout=30)
    seen.add(name)
    return name, report


def _running(podman: Podman, job: str) -> list[dict[str, Any]]:
    return [
        c
        for c in podman.containers(f"label=allocator.job={job}")
        if str(c.get("State")) == "running"
    ]


def _fake_gpus_seen(report: dict[str, Any]) -> tuple[list[str], list[str]]:
    env = sorted(k for k in report["env"] if k.startswith("ALLOCATOR_TEST_GPU_"))
    dev = sorted(d for d in report["dev"] if d.startswith("allocator-test-gpu"))
    return env, dev


def test_a_container_sees_its_cdi_device_is_adopted_falls_back_to_cpu_and_stops(
    world: AgentHarness, podman: Podman, prefix: str
) -> None:
    job = f"box-{prefix.strip('/')[-8:]}"
    world.apply_policy(_policy(world, podman, job))
    world.start_agent(env=podman.environ)
    assert world.cli("set", f"job={job}", "gpus=1").code == 0
    seen: set[str] = set()
    first, report = _new_report(world, seen)
    # From inside: exactly its one CDI device, and its environment by name.
    assert _fake_gpus_seen(report) == (["ALLOCATOR_TEST_GPU_1"], ["allocator-test-gpu1"])
    assert report["env"]["CUDA_VISIBLE_DEVICES"] == fake_uuid(1)
    assert report["env"]["TRAINING_RUN"] == "seven"
    assert not any(k.startswith(("ALLOCATOR_STORE", "ALLOCATOR_PREFIX")) for k in report["env"])
    # The engine's command line names the variables, never their values (ps shows it).
    record = wait_for("the worker's pid", lambda: (r := world.worker_record(job)) and r.pids and r)
    argv = Path(f"/proc/{record.pids[0]}/cmdline").read_bytes().split(b"\0")
    assert b"run" in argv and b"TRAINING_RUN" in argv and b"seven" not in b" ".join(argv)
    [box] = _running(podman, job)
    labels = box["Labels"]
    assert (labels["allocator.host"], labels["allocator.worker"]) == (HOST, "0")
    assert int(labels["allocator.revision"]) > 0

    # kill -9 of the agent: the new one adopts the container, never starts a second.
    assert world.stop_agent(signal.SIGKILL) == -signal.SIGKILL
    world.start_agent(env=podman.environ)
    adopt = wait_for("the adoption", lambda: world.events("adopt")[1:])
    assert adopt[0]["adopted"] == [job]
    record = wait_for(
        "the worker reported running",
        lambda: (r := world.worker_record(job)) and r.state == "running" and r,
    )
    assert [c["Id"] for c in _running(podman, job)] == [box["Id"]]
    assert set(_reports(world)) == {first}
    assert record.gpus == (1,)

    # Its GPU fails: the job moves to the CPU, in a container with no device at all.
    world.gpus.update(1, healthy=False)
    second, on_cpu = _new_report(world, seen)
    assert _fake_gpus_seen(on_cpu) == ([], [])
    assert on_cpu["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert on_cpu["env"]["ALLOCATOR_DEVICE"] == "cpu"
    assert _reports(world)[first]["term"]  # the first was stopped by its SIGTERM
    assert [c["Id"] for c in _running(podman, job)] != [box["Id"]]

    # Released: stopped cleanly (its SIGTERM, its exit code recorded), nothing left.
    assert world.cli("release", f"job={job}").code == 0
    wait_for("no container left", lambda: not podman.containers(f"label=allocator.job={job}"))
    assert _reports(world)[second]["term"]
    exits = wait_for("both exits recorded", lambda: world.events("worker-exited", job=job)[1:])
    assert [e["exit_code"] for e in world.events("worker-exited", job=job)] == [3, 3]
    assert exits


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def test_a_container_whose_shim_is_killed_is_removed_before_the_worker_starts_again(
    world: AgentHarness, podman: Podman, prefix: str
) -> None:
    """The engine's monitor outlives a shim killed outright: the container must not run on."""
    job = f"box-{prefix.strip('/')[-8:]}"
    # As under systemd's cgroup manager, the container lives outside the worker's cgroup.
    world.apply_policy(_policy(world, podman, job, ("--cgroup-parent=/allocator-test",)))
    world.start_agent(env=podman.environ)
    assert world.cli("set", f"job={job}", "gpus=2").code == 0
    seen: set[str] = set()
    first, _ = _new_report(world, seen)
    [box] = _running(podman, job)
    record = wait_for("the worker's pid", lambda: (r := world.worker_record(job)) and r.pids and r)
    os.kill(_parent(record.pids[0]), signal.SIGKILL)  # the shim; its engine `run` goes with it
    _, report = _new_report(world, seen)
    assert _fake_gpus_seen(report) == (["ALLOCATOR_TEST_GPU_2"], ["allocator-test-gpu2"])
    # The first container was removed (not stopped: no SIGTERM) before the second started.
    assert box["Id"] not in [c["Id"] for c in podman.containers(f"label=allocator.job={job}")]
    assert not _reports(world)[first]["term"]
    assert len(_running(podman, job)) == 1
