"""Doctor checks over the fake NVML: each finding, and the whole run."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from allocator.doctor.checks import (
    Finding,
    TorchReport,
    environment_findings,
    gpu_count_findings,
    nvml_findings,
    overall,
    probe_torch,
    run_checks,
    torch_findings,
)
from allocator.errors import StoreUnavailable
from allocator.gpus.inventory import Inventory
from allocator.gpus.vendors.nvidia.vendor import read_inventory
from allocator.policy.model import Host, Policy
from allocator.records.gpu_info import GpuInfo
from tests.support.fake_gpus import fake_device, fake_environ, write_fake_nvml

POLICY = Policy(version=1, hosts={"node1": Host("node1", 2)})


def fake_inventory(
    tmp_path: Path, devices: int | list[dict[str, object]], **system: object
) -> Inventory:
    path = write_fake_nvml(tmp_path / "nvml.json", devices, **system)
    return read_inventory(2, environ=fake_environ(path))


def by_check(findings: list[Finding], check: str) -> Finding:
    (finding,) = [f for f in findings if f.check == check]
    return finding


def statuses(findings: list[Finding]) -> list[str]:
    return [f.status for f in findings]


def test_nvml_reachable_reports_driver_and_cuda(tmp_path: Path) -> None:
    inventory = fake_inventory(tmp_path, 2, driver_version="550.54.15", cuda_driver_version=12040)
    (finding,) = nvml_findings(inventory, 2, {})
    assert finding.status == "ok"
    assert "550.54.15" in finding.message and "CUDA 12.4" in finding.message
    assert "2 GPU(s)" in finding.message


@pytest.mark.parametrize(
    ("declared", "environ", "status"),
    [(2, {}, "fail"), (None, {}, "warn"), (0, {}, "warn"), (2, {"ALLOCATOR_NVML": "off"}, "warn")],
)
def test_nvml_unreachable(declared: int | None, environ: dict[str, str], status: str) -> None:
    inventory = Inventory(gpus=(), source="none", error="no GPUs found: driver not loaded")
    (finding,) = nvml_findings(inventory, declared, environ)
    assert finding.status == status
    assert "driver not loaded" in finding.message and finding.hint


@pytest.mark.parametrize(
    ("seen", "status", "words"),
    [(2, "ok", "as the policy declares"), (1, "fail", "NVML sees 1"), (3, "warn", "GPU(s) 2-2")],
)
def test_gpu_count_against_policy(tmp_path: Path, seen: int, status: str, words: str) -> None:
    (finding,) = gpu_count_findings(fake_inventory(tmp_path, seen), POLICY, "node1")
    assert (finding.status, finding.check) == (status, "gpus")
    assert words in finding.message


def test_gpu_count_without_policy_host_or_nvml(tmp_path: Path) -> None:
    inventory = fake_inventory(tmp_path, 2)
    assert statuses(gpu_count_findings(inventory, None, "node1")) == ["warn"]
    (missing,) = gpu_count_findings(inventory, POLICY, "node9")
    assert missing.status == "warn" and "node9 is not declared" in missing.message
    declared = read_inventory(2, environ={"ALLOCATOR_NVML": "off"})
    (fallback,) = gpu_count_findings(declared, POLICY, "node1")
    assert fallback.status == "warn" and "2 declared" in fallback.message


def test_gpu_that_does_not_answer_is_a_failure(tmp_path: Path) -> None:
    inventory = fake_inventory(tmp_path, [fake_device(0), fake_device(1, lost=True)])
    count, lost = gpu_count_findings(inventory, POLICY, "node1")
    assert count.status == "ok"
    assert lost.status == "fail" and "GPU 1" in lost.message and "lost" in lost.message


@pytest.mark.parametrize(
    ("environ", "status", "words"),
    [
        ({}, "ok", "no CUDA device selection"),
        ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "ok", "no CUDA device selection"),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "warn", "CUDA_VISIBLE_DEVICES='0'"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "warn", "CUDA_VISIBLE_DEVICES=''"),
        ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "warn", "FASTEST_FIRST"),
    ],
)
def test_environment_that_fights_the_agent(
    environ: dict[str, str], status: str, words: str
) -> None:
    (finding,) = environment_findings(environ)
    assert finding.status == status and words in finding.message


def report(cuda: str | None, available: bool = False, count: int = 0) -> TorchReport:
    return TorchReport(version="2.13.0", cuda=cuda, available=available, device_count=count)


NVML_2 = Inventory(gpus=(GpuInfo(0), GpuInfo(1)), source="nvml", cuda_driver_version=12040)
NVML_0 = Inventory(gpus=(), source="nvml", cuda_driver_version=12040)
NO_NVML = Inventory(gpus=(), source="none", error="no GPUs found")


@pytest.mark.parametrize(
    ("rep", "inventory", "expected"),
    [
        (None, NVML_2, "torch:ok"),
        ("asking PyTorch failed: timed out", NVML_2, "torch:fail"),
        (report(None), NVML_2, "torch:ok torch-cuda:fail torch-gpus:fail"),
        (report(None), NVML_0, "torch:ok torch-cuda:ok torch-gpus:ok"),
        (report("13.0", True, 2), NVML_2, "torch:ok torch-cuda:fail torch-gpus:ok"),
        (report("12.8", True, 2), NVML_2, "torch:ok torch-cuda:warn torch-gpus:ok"),
        (report("12.1", True, 2), NVML_2, "torch:ok torch-cuda:ok torch-gpus:ok"),
        (report("11.8", False), NVML_2, "torch:ok torch-cuda:ok torch-gpus:fail"),
        (report("12.1", True, 1), NVML_2, "torch:ok torch-cuda:ok torch-gpus:warn"),
        (report("12.1", True, 1), NO_NVML, "torch:ok torch-cuda:warn torch-gpus:warn"),
    ],
)
def test_torch_findings(rep: TorchReport | str | None, inventory: Inventory, expected: str) -> None:
    findings = torch_findings(rep, inventory)
    assert " ".join(f"{f.check}:{f.status}" for f in findings) == expected


def test_torch_newer_than_driver_names_both_versions() -> None:
    finding = by_check(torch_findings(report("13.0", True, 2), NVML_2), "torch-cuda")
    assert "13.0" in finding.message and "12.4" in finding.message
    assert "driver" in finding.hint


def test_probe_torch_asks_the_installed_torch_in_a_subprocess() -> None:
    result = probe_torch({"CUDA_VISIBLE_DEVICES": ""}, 120.0)
    assert isinstance(result, TorchReport)
    assert result.version == version("torch")
    # CUDA_VISIBLE_DEVICES is dropped so the answer compares with NVML's view
    assert result.available == (result.device_count > 0)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("import time; time.sleep(60)", "did not finish"),
        ("print('hello')", "no report"),
        ("print('ALLOCATOR-TORCH-REPORT {}')", "unreadable"),
        ("raise SystemExit(4)", "exit status 4"),
    ],
)
def test_probe_torch_failures_are_one_line(code: str, words: str) -> None:
    result = probe_torch({}, 1.0 if "sleep" in code else 60.0, command=[sys.executable, "-c", code])
    assert isinstance(result, str) and words in result and "\n" not in result


def test_probe_torch_is_none_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from allocator.doctor.checks import probe_torch\n"
        "print(probe_torch({}, 5.0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_store_and_agent_checks_are_called_and_failures_reported(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2)

    def store() -> Finding:
        raise StoreUnavailable("etcd://127.0.0.1:1 did not answer")

    def agent() -> Finding:
        return Finding("ok", "agent", "heartbeat 2s ago")

    findings = run_checks(POLICY, "node1", fake_environ(path), store, agent, check_torch=False)
    assert [f.check for f in findings] == ["nvml", "gpus", "environment", "store", "agent"]
    assert by_check(findings, "store").status == "fail"
    assert "did not answer" in by_check(findings, "store").message
    assert by_check(findings, "agent").message == "heartbeat 2s ago"
    assert overall(findings) == "fail"


def test_overall_is_the_worst_status() -> None:
    assert overall([]) == "ok"
    assert overall([Finding("ok", "a", ""), Finding("warn", "b", "")]) == "warn"


@pytest.mark.slow
def test_full_run_never_imports_torch_in_process(tmp_path: Path) -> None:
    path = write_fake_nvml(tmp_path / "nvml.json", 2)
    code = (
        "import json, sys\n"
        "from allocator.doctor.checks import run_checks\n"
        "from allocator.policy.model import Host, Policy\n"
        "policy = Policy(version=1, hosts={'node1': Host('node1', 2)})\n"
        f"env = {{'ALLOCATOR_NVML': 'fake:{path}', 'CUDA_VISIBLE_DEVICES': '1'}}\n"
        "found = run_checks(policy, 'node1', env, None, None, torch_timeout=120)\n"
        "print(json.dumps([[f.check, f.status] for f in found] + ['torch' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    *findings, torch_imported = json.loads(out.stdout)
    assert torch_imported is False
    checks = dict(findings)
    assert checks["nvml"] == "ok" and checks["gpus"] == "ok"
    assert checks["environment"] == "warn"
    assert checks["torch"] == "ok"
    assert {"torch-cuda", "torch-gpus"} <= checks.keys()
