"""Recovering GPUs are re-tested by the policy's probe before jobs get them back."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from allocator.agent.gpu_care.recovery import RecoveryProbes, probe_environment
from allocator.agent.gpu_care.state import GpuState
from allocator.gpus.probe import ProbeResult
from allocator.gpus.vendors.amd.vendor import AMD
from allocator.policy.model import HealthSettings, Policy
from allocator.records.gpu_info import GpuInfo
from tests.support.fake_gpus import FakeGpus
from tests.support.level_zero import Card, Device, level_zero_devices
from tests.support.waiting import wait_for

COMMAND = ("probe",)


class ScriptedProbe:
    """A probe runner whose outcome the test decides; it records each environment."""

    def __init__(self) -> None:
        self.ok = False
        self.release = threading.Event()
        self.release.set()
        self.calls: list[Mapping[str, str]] = []

    def __call__(
        self, env: Mapping[str, str], timeout: float, command: Sequence[str]
    ) -> ProbeResult:
        self.calls.append(dict(env))
        self.release.wait(10)
        if self.ok:
            return ProbeResult(True, "", 0, False, "", 0)
        return ProbeResult(False, "probe failed with exit status 1: CUDA error", 1, False, "", 0)


def _probes(runner: ScriptedProbe) -> tuple[RecoveryProbes, list[tuple[str, dict[str, object]]]]:
    events: list[tuple[str, dict[str, object]]] = []
    probes = RecoveryProbes({"PATH": "/bin"}, lambda e, f: events.append((e, f)), run_probe=runner)
    return probes, events


def test_without_a_probe_nvml_alone_returns_the_gpu() -> None:
    probes, _ = _probes(ScriptedProbe())
    assert probes.out_of_service({}, {2: "XID 79"}, None, 5, None, 0.0) == {}


def test_a_recovering_gpu_stays_out_until_its_probe_passes() -> None:
    runner = ScriptedProbe()
    runner.release.clear()  # the probe "runs" until released
    probes, events = _probes(runner)
    out = probes.out_of_service({}, {2: "XID 79"}, COMMAND, 5, None, 0.0)
    assert out == {2: "recovering: re-test running"}
    assert probes.out_of_service({}, out, COMMAND, 5, None, 1.0) == {
        2: "recovering: re-test running"
    }
    runner.ok = True
    runner.release.set()
    wait_for(
        "the probe to pass", lambda: probes.out_of_service({}, out, COMMAND, 5, None, 2.0) == {}
    )
    assert ("gpu-recovered", {"gpu": 2, "probe": "passed"}) in events
    assert len(runner.calls) == 1


def test_a_failed_probe_keeps_the_gpu_out_and_is_retried_later() -> None:
    runner = ScriptedProbe()
    probes, events = _probes(runner)
    out = probes.out_of_service({}, {1: "XID 48"}, COMMAND, 5, None, 0.0)

    def failed() -> dict[int, str] | None:
        now = probes.out_of_service({}, out, COMMAND, 5, None, 10.0)
        return now if now[1].startswith("re-test failed") else None

    assert "CUDA error" in wait_for("the failure", failed)[1]
    assert len(runner.calls) == 1  # no retry before retry_after (60 s) has passed
    runner.ok = True
    probes.out_of_service({}, out, COMMAND, 5, None, 61.0)  # past the retry time
    wait_for("a second probe", lambda: len(runner.calls) == 2)
    wait_for("the GPU back", lambda: probes.out_of_service({}, out, COMMAND, 5, None, 62.0) == {})
    assert any(e == "gpu-retest-failed" for e, _ in events)


def test_a_gpu_that_turns_bad_again_is_probed_afresh_next_time() -> None:
    runner = ScriptedProbe()
    probes, _ = _probes(runner)
    out = probes.out_of_service({}, {0: "XID 79"}, COMMAND, 5, None, 0.0)
    wait_for(
        "the probe", lambda: probes.out_of_service({}, out, COMMAND, 5, None, 1.0)[0] != out[0]
    )
    assert probes.out_of_service({0: "XID 79"}, out, COMMAND, 5, None, 2.0) == {0: "XID 79"}
    runner.ok = True
    probes.out_of_service({}, {0: "XID 79"}, COMMAND, 5, None, 3.0)  # recovered again: new probe
    wait_for("a new probe", lambda: len(runner.calls) == 2)


def test_the_probe_sees_only_the_recovering_gpu_by_uuid() -> None:
    inventory = [GpuInfo(3, uuid="GPU-3"), GpuInfo(4)]
    env = probe_environment({"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1"}, 3, inventory)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-3" == env["NVIDIA_VISIBLE_DEVICES"]
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["PATH"] == "/bin"
    assert probe_environment({}, 4, inventory)["CUDA_VISIBLE_DEVICES"] == "4"


def test_a_real_probe_process_that_hangs_is_killed_and_counts_as_a_failure(tmp_path: Path) -> None:
    probes = RecoveryProbes({"PATH": "/usr/bin:/bin"}, lambda e, f: None)
    hang = (sys.executable, "-c", "import time; time.sleep(60)")
    out = probes.out_of_service({}, {1: "XID 79"}, hang, 0.5, None, 0.0)

    def failed() -> str | None:
        reason = probes.out_of_service({}, out, hang, 0.5, None, 1.0)[1]
        return reason if reason.startswith("re-test failed") else None

    assert "did not finish within 0.5s" in wait_for("the timeout", failed)


def test_on_an_intel_host_the_probe_sees_the_recovering_card_alone() -> None:
    pci = ["0000:18:00.0", "0000:42:00.0", "0000:6c:00.0"]
    inventory = [GpuInfo(index, pci_bus_id=slot) for index, slot in enumerate(pci)]
    env = probe_environment({"PATH": "/bin"}, 2, inventory, "intel")
    assert env == {
        "PATH": "/bin",
        "ZE_AFFINITY_MASK": "2",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
        "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
        "ONEAPI_DEVICE_SELECTOR": "level_zero:*",
        "ALLOCATOR_VENDOR": "intel",
        "ALLOCATOR_DEVICE": "xpu",
        "ALLOCATOR_GPUS": "2",
        "ALLOCATOR_GPU_COUNT": "1",
    }
    cards = [Card(pci[1], 2), Card(pci[2], 2), Card(pci[0], 2)]
    assert level_zero_devices(env, cards) == [Device(pci[2], (0, 1))]


def test_on_an_amd_host_the_probe_gets_rocr_s_filter_from_the_device_layer() -> None:
    info = GpuInfo(1, uuid="GPU-4c2a3f1e5d6b7a80", pci_bus_id="0000:c1:00.0")
    env = probe_environment({"PATH": "/bin"}, 1, [GpuInfo(0), info], "amd")
    assert (
        env["ROCR_VISIBLE_DEVICES"]
        == AMD.visible_env(AMD.device_ids([1], {1: info}, True))["ROCR_VISIBLE_DEVICES"]
    )
    assert not {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"} & set(env)
    assert (env["ALLOCATOR_DEVICE"], env["ALLOCATOR_VENDOR"]) == ("cuda", "amd")


def test_the_agent_probes_a_returning_intel_card_through_level_zero(tmp_path: Path) -> None:
    gpus = FakeGpus(tmp_path / "intel.json", 2, vendor="intel")
    seen = tmp_path / "probe-env.json"
    # Written aside and renamed, so the test never reads half a file.
    record = (
        f"import json, os; f = open({str(seen)!r} + '.tmp', 'w'); json.dump(dict(os.environ), f); "
        f"f.close(); os.rename({str(seen)!r} + '.tmp', {str(seen)!r})"
    )
    health = HealthSettings(recovery_probe=(sys.executable, "-c", record), hold_down_seconds=0.0)
    policy = Policy(version=1, health=health)
    state = GpuState(gpus.environ, tmp_path / "gpus.json", lambda e, f: None, 100.0, boot_id="b")
    gpus.update(1, lost=True)
    assert list(state.check(101.0, policy, "node1", None)) == [1]
    gpus.update(1, lost=False)
    state.check(102.0, policy, "node1", None)
    env = json.loads(wait_for("the probe", lambda: (seen.exists() and seen.read_text()) or None))
    assert (env["ZE_AFFINITY_MASK"], env["ALLOCATOR_DEVICE"]) == ("1", "xpu")
    assert "CUDA_VISIBLE_DEVICES" not in env
    cards = [Card(gpu.pci_bus_id or "", 2) for gpu in reversed(state.inventory.gpus)]
    assert level_zero_devices(env, cards) == [Device(cards[0].pci, (0, 1))]  # card 1 alone
