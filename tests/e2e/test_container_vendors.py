"""Each vendor's CDI naming under a real podman: the devices, their numbers, a job user.

Marked ``container`` like tests/e2e/test_containers.py (root, podman,
busybox-static). For each vendor the host's CDI spec is written in the shape
of that vendor's generator (:mod:`tests.support.cdi_specs`), with fake device
nodes; a job running as ``nobody`` holds two of four GPUs, and from inside
its container the test reads which device nodes it got, whether it could open
each, and its visibility variables.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.gpus.vendors.registry import VENDORS
from tests.e2e.agent_harness import HOST, AgentHarness
from tests.support.cdi_specs import FakeNodes, amd_spec, installed_spec, intel_spec, nvidia_spec
from tests.support.podman import Podman, podman_or_skip
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.container]

_SCRIPT = (
    "o=/out/$(hostname); ls /dev/dri > $o.dri 2>/dev/null; ls /dev > $o.dev; "
    'for f in /dev/dri/* /dev/kfd /dev/nvidia[0-9]*; do [ -e "$f" ] || continue; '
    'if (: < "$f") 2>/dev/null; then echo "ok $f"; else echo "denied $f"; fi; '
    "done > $o.open; env > $o.env.tmp; mv $o.env.tmp $o.env; "
    "trap 'exit 3' TERM; while :; do sleep 0.05; done"
)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman, CDI specs under /var/run/cdi, device nodes")
    yield from podman_or_skip(tmp_path_factory.mktemp("podman"))


@pytest.fixture
def world(tmp_path: Path, prefix: str, podman: Podman) -> Iterator[AgentHarness]:
    harness = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the job's user writes its report there
    try:
        yield harness
    finally:
        harness.cleanup()
        for found in podman.containers(f"label=allocator.job={_job(prefix)}"):
            podman.run("rm", "-f", str(found["Id"]), check=False)


def _job(prefix: str) -> str:
    return f"dev-{prefix.strip('/')[-8:]}"


def _spec(vendor: str, naming: str, world: AgentHarness) -> dict[str, Any]:
    nodes = FakeNodes(world.workdir / "nodes")
    inventory = VENDORS[vendor].read_inventory(None, world.gpus.environ).gpus
    if vendor == "nvidia":
        return nvidia_spec([str(gpu.uuid) for gpu in inventory], nodes)
    if vendor == "amd":
        return amd_spec(len(inventory), nodes)
    cards = {gpu.drm_card or 0: (str(gpu.pci_bus_id), str(gpu.pci_device_id)) for gpu in inventory}
    return intel_spec(cards, nodes, naming)


def _report(world: AgentHarness) -> dict[str, Any]:
    out = world.workdir / "out"

    def ready() -> dict[str, Any] | None:
        for env_file in out.glob("*.env"):
            name = str(env_file)[: -len(".env")]
            lines = env_file.read_text().splitlines()
            return {
                "env": dict(line.split("=", 1) for line in lines if "=" in line),
                "dri": sorted(Path(f"{name}.dri").read_text().split()),
                "dev": Path(f"{name}.dev").read_text().split(),
                "open": sorted(Path(f"{name}.open").read_text().splitlines()),
            }
        return None

    return wait_for("the container's report", ready, timeout=30)


@pytest.mark.parametrize(
    ("vendor", "naming"), [("nvidia", "card"), ("amd", "card"), ("intel", "card"), ("intel", "pci")]
)
def test_a_job_user_sees_exactly_its_devices_numbered_as_its_container_numbers_them(
    world: AgentHarness, podman: Podman, prefix: str, vendor: str, naming: str
) -> None:
    job = _job(prefix)
    world.gpus.system["vendor"] = vendor
    world.gpus.save()
    host: dict[str, Any] = {"gpus": 4, "vendor": vendor}
    if vendor == "intel":
        host["cdi_names"] = naming
    world.apply_policy(
        {
            "version": 1,
            "visible_devices": "index",  # indices must be the container's, not the host's
            "hosts": {HOST: host},
            "jobs": {
                job: {
                    "command": ["/bin/sh", "-c", _SCRIPT],
                    "grace_seconds": 5,
                    "user": "nobody",
                    "container": {
                        "image": podman.image,
                        "mounts": [f"{world.workdir / 'out'}:/out"],
                    },
                }
            },
        }
    )
    with installed_spec(_spec(vendor, naming, world)):
        world.start_agent(env=podman.environ)
        assert world.cli("set", f"job={job}", "gpus=3,1").code == 0
        report = _report(world)
    env = report["env"]
    if vendor == "nvidia":
        assert [d for d in report["dev"] if d.startswith("nvidia")] == ["nvidia1", "nvidia3"]
        assert report["open"] == ["ok /dev/nvidia1", "ok /dev/nvidia3"]
        # The container's CUDA numbers its two GPUs 0 and 1 in PCI order: GPU 3 is its 1.
        assert env["CUDA_VISIBLE_DEVICES"] == "1,0"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        return
    assert report["dri"] == ["card1", "card3", "renderD129", "renderD131"]
    opened = [f"ok /dev/dri/{name}" for name in report["dri"]]
    if vendor == "amd":
        known = {g.index: g for g in VENDORS["amd"].read_inventory(None, world.gpus.environ).gpus}
        # ROCr's UUIDs mean the same inside: the device layer's own value.
        ids = VENDORS["amd"].device_ids((3, 1), known, True)
        assert env["ROCR_VISIBLE_DEVICES"] == ",".join(ids)
        assert report["open"] == sorted([*opened, "ok /dev/kfd"])
    else:
        # Level Zero's mask filters but never reorders: the container's two cards are
        # its 0 and 1 in PCI order, and the mask lists them so (ALLOCATOR_GPUS too).
        assert env["ZE_AFFINITY_MASK"] == "0,1"
        assert env["ALLOCATOR_GPUS"] == "1,3"
        assert report["open"] == opened
