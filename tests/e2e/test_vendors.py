"""Three hosts of three vendors, for real: an NVIDIA, an AMD and an Intel host (fakes).

Each host's agent finds its vendor from its fake-GPU file (NVML's, amdsmi's
and sysfs's fakes answer for it), publishes it, and starts real workers that
see exactly their GPU through that vendor's variables, and none of the
variables the agent itself was started with.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from allocator.gpus.vendors.fake_file import default_unique_id
from tests.e2e.agent_harness import DUMMY, AgentHarness, hosts_of
from tests.support.waiting import wait_for

VENDOR_OF = {"nv1": "nvidia", "amd1": "amd", "intel1": "intel"}
UUID_OF_GPU_1 = "GPU-00000000-0000-4000-8000-000000000001"  # the fake's default UUID
# ROCr's name for AMD GPU 1: GPU- and the 16 hex digits of the fake's default KFD unique_id.
ROCR_UUID_OF_GPU_1 = f"GPU-{default_unique_id(1):016X}"


def vendor_policy(workdir: Path, intel_says: str = "intel") -> dict[str, Any]:
    """Three hosts of 2 GPUs, each saying its vendor; one job per host, and one across two."""

    def job(name: str) -> dict[str, Any]:
        return {
            "command": [
                sys.executable,
                str(DUMMY),
                "--out",
                str(workdir / f"{name}-{{host}}.json"),
            ],
            "grace_seconds": 1,
            "fallback": "cpu",
        }

    hosts = {name: {"gpus": 2, "vendor": vendor} for name, vendor in VENDOR_OF.items()}
    hosts["intel1"]["vendor"] = intel_says
    return {
        "version": 1,
        "visible_devices": "uuid",
        "hosts": hosts,
        "jobs": {
            **{f"probe-{name}": job(f"probe-{name}") for name in VENDOR_OF},
            "dist": job("dist"),
        },
        "fallback": {"cpu": {"action": "cpu", "threads": 2}},
        "health": {"interval_seconds": 0.2, "hold_down_seconds": 0.5},
    }


@pytest.fixture
def hosts(tmp_path: Path, store_url: str, prefix: str) -> Iterator[dict[str, AgentHarness]]:
    """The three hosts with their fake GPUs and the policy applied; agents not started."""
    with hosts_of(tmp_path, store_url, prefix, list(VENDOR_OF)) as agents:
        for name, vendor in VENDOR_OF.items():
            agents[name].gpus.system["vendor"] = vendor
            agents[name].gpus.save()
        path = tmp_path / "policy.yaml"
        path.write_text(json.dumps(vendor_policy(tmp_path)))
        checked = agents["nv1"].cli("policy", "validate", str(path))
        assert checked.code == 0, checked.err
        agents["nv1"].apply_policy(vendor_policy(tmp_path))
        yield agents


# Device filters the agents are started with: a worker must see none of them.
AGENT_FILTERS = {
    "CUDA_VISIBLE_DEVICES": "0",
    "HIP_VISIBLE_DEVICES": "0",
    "ROCR_VISIBLE_DEVICES": "0",
    "ZE_AFFINITY_MASK": "0",
}


def _report(workdir: Path, job: str, host: str) -> dict[str, Any] | None:
    with suppress(FileNotFoundError, ValueError):
        report: dict[str, Any] = json.loads((workdir / f"{job}-{host}.json").read_text())
        return report
    return None


@pytest.mark.slow
def test_three_vendors_each_worker_sees_exactly_its_gpu(
    hosts: dict[str, AgentHarness], tmp_path: Path
) -> None:
    for agent in hosts.values():
        agent.start_agent(env=AGENT_FILTERS)
    nv1 = hosts["nv1"]
    for name in VENDOR_OF:
        result = nv1.cli("set", f"job=probe-{name}", f"host={name}", "gpus=1")
        assert result.code == 0, result.err
    envs = {
        name: wait_for(f"{name}'s worker", lambda n=name: _report(tmp_path, f"probe-{n}", n))["env"]
        for name in VENDOR_OF
    }
    filters = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
    nvidia, amd, intel = envs["nv1"], envs["amd1"], envs["intel1"]
    assert nvidia["CUDA_VISIBLE_DEVICES"] == UUID_OF_GPU_1
    assert (nvidia["ALLOCATOR_VENDOR"], nvidia["ALLOCATOR_DEVICE"]) == ("nvidia", "cuda")
    assert "ROCR_VISIBLE_DEVICES" not in nvidia and "ZE_AFFINITY_MASK" not in nvidia
    # AMD: ROCr's filter alone, by ROCr's UUID; HIP's and CUDA's would index what ROCr left.
    assert amd["ROCR_VISIBLE_DEVICES"] == ROCR_UUID_OF_GPU_1
    assert "HIP_VISIBLE_DEVICES" not in amd and "CUDA_VISIBLE_DEVICES" not in amd
    assert (amd["ALLOCATOR_VENDOR"], amd["ALLOCATOR_DEVICE"]) == ("amd", "cuda")
    # Intel: the Level Zero mask by PCI-ordered index, SYCL over what it left.
    assert (intel["ZE_AFFINITY_MASK"], intel["ZE_ENABLE_PCI_ID_DEVICE_ORDER"]) == ("1", "1")
    assert intel["ONEAPI_DEVICE_SELECTOR"] == "level_zero:*"
    assert (intel["ALLOCATOR_VENDOR"], intel["ALLOCATOR_DEVICE"]) == ("intel", "xpu")
    assert not any(name in intel for name in filters)

    for name, env in envs.items():  # `allocator env` shows what each agent gave
        shown_env = nv1.cli("env", f"job=probe-{name}", f"host={name}", "-o", "json")
        assert shown_env.code == 0, shown_env.err
        (listed,) = json.loads(shown_env.out)
        assert {key: env.get(key) for key in listed} == listed

    status = nv1.cli("status", "-o", "json")
    assert status.code == 0, status.err
    shown = {
        h["host"]: (h["vendor"], h["vendor_mismatch"]) for h in json.loads(status.out)["hosts"]
    }
    assert shown == {name: (vendor, "") for name, vendor in VENDOR_OF.items()}

    # One job across hosts of two vendors is refused, and nothing is written.
    mixed = nv1.cli("set", "job=dist", "host=nv1,amd1", "count=1")
    assert mixed.code == 2 and "different vendors" in mixed.err, mixed.err
    assert "\n" not in mixed.err.strip() and "Traceback" not in mixed.err
    assert nv1.cli("get", "job=dist").code == 6


def test_a_vendor_the_policy_does_not_expect_is_reported(
    hosts: dict[str, AgentHarness], tmp_path: Path
) -> None:
    hosts["intel1"].start_agent()
    hosts["nv1"].apply_policy(vendor_policy(tmp_path, intel_says="amd"))
    status = hosts["nv1"].cli("status")
    assert status.code == 0, status.err
    mismatch = "the policy says amd GPUs, the agent found intel"
    assert f"intel1: agent alive, intel GPUs (MISMATCH: {mismatch})" in status.out


# Per vendor: the variable showing GPU 1, the one hiding every GPU, and why GPU 1 went.
LOSS = {
    "amd1": (
        ("ROCR_VISIBLE_DEVICES", ROCR_UUID_OF_GPU_1),
        ("ROCR_VISIBLE_DEVICES", "-1"),
        "amdsmi",
    ),
    "intel1": (("ZE_AFFINITY_MASK", "1"), ("ONEAPI_DEVICE_SELECTOR", "opencl:cpu"), "gone"),
}


@pytest.mark.parametrize("name", sorted(LOSS))
def test_a_gpu_its_library_loses_moves_the_job_to_the_cpu_and_back(
    hosts: dict[str, AgentHarness], tmp_path: Path, name: str
) -> None:
    (shown, value), (hidden, none), why = LOSS[name]
    agent = hosts[name]
    agent.start_agent()
    assert agent.cli("set", f"job=probe-{name}", f"host={name}", "gpus=1").code == 0

    def env_on(device: str) -> dict[str, str] | None:
        report = _report(tmp_path, f"probe-{name}", name)
        env: dict[str, str] | None = report["env"] if report else None
        return env if env is not None and env["ALLOCATOR_DEVICE"] == device else None

    assert wait_for("the worker on GPU 1", lambda: env_on(VENDOR_DEVICE[name]))[shown] == value
    agent.gpus.update(1, lost=True)  # amdsmi fails on it; its card leaves sysfs
    on_cpu = wait_for("the worker on the CPU", lambda: env_on("cpu"))
    assert on_cpu[hidden] == none and on_cpu["OMP_NUM_THREADS"] == "2"
    assert why in on_cpu["ALLOCATOR_FALLBACK_REASON"] and on_cpu.get(shown) != value
    agent.gpus.update(1, lost=None)
    back = wait_for("the worker back on GPU 1", lambda: env_on(VENDOR_DEVICE[name]))
    assert back[shown] == value


VENDOR_DEVICE = {"amd1": "cuda", "intel1": "xpu"}
