"""``doctor`` on hosts of other vendors: the vendor against the policy, the torch build."""

from __future__ import annotations

from pathlib import Path

import torch

from allocator.doctor.checks import Finding, TorchReport, overall, run_checks
from allocator.doctor.vendor_checks import vendor_torch_findings
from allocator.gpus.vendors.registry import read_host_inventory
from allocator.policy.model import Host, Policy
from tests.support.fake_gpus import fake_environ, write_fake_nvml


def policy(vendor: str | None) -> Policy:
    return Policy(version=1, hosts={"node1": Host("node1", 2, vendor=vendor)})


def by_check(findings: list[Finding], check: str) -> Finding:
    (finding,) = [f for f in findings if f.check == check]
    return finding


def amd_host(tmp_path: Path) -> dict[str, str]:
    return fake_environ(write_fake_nvml(tmp_path / "gpus.json", 2, vendor="amd"))


def test_an_amd_host_as_the_policy_says(tmp_path: Path) -> None:
    findings = run_checks(policy("amd"), "node1", amd_host(tmp_path), None, None, check_torch=False)
    assert [f.check for f in findings] == ["vendor", "devices", "gpus", "environment"]
    assert by_check(findings, "vendor").message == "amd GPUs, as the policy says"
    assert by_check(findings, "devices").message == "fake amd: driver 550.54.15, 2 amd GPU(s)"
    assert overall(findings) == "ok"


def test_a_vendor_the_policy_does_not_say_fails(tmp_path: Path) -> None:
    findings = run_checks(
        policy("nvidia"), "node1", amd_host(tmp_path), None, None, check_torch=False
    )
    vendor = by_check(findings, "vendor")
    assert vendor.status == "fail"
    assert vendor.message == "the policy says node1 has nvidia GPUs but this host has amd GPUs"


def test_this_cpu_wheel_on_an_amd_host_fails_in_one_line(tmp_path: Path) -> None:
    # The real PyTorch here (a CPU build), asked in a subprocess as doctor always does.
    findings = run_checks(policy("amd"), "node1", amd_host(tmp_path), None, None)
    build = by_check(findings, "torch-build")
    assert build.status == "fail" and "\n" not in build.message
    assert build.message.startswith(f"PyTorch {torch.__version__} is a CPU-only build on an AMD")


def test_a_cuda_wheel_on_an_amd_host_is_an_error(tmp_path: Path) -> None:
    inventory = read_host_inventory(environ=amd_host(tmp_path))
    cuda_wheel = TorchReport("2.5.1+cu124", "12.4", available=False, device_count=0)
    findings = vendor_torch_findings(cuda_wheel, inventory)
    assert [(f.check, f.status) for f in findings] == [("torch", "ok"), ("torch-build", "fail")]
    assert findings[1].message == (
        "PyTorch 2.5.1+cu124 is a CUDA build (CUDA 12.4) on an AMD host; install PyTorch's "
        "ROCm build (https://pytorch.org/get-started/locally/)"
    )
    rocm_wheel = TorchReport("2.5.1+rocm6.2", None, True, 2, hip="6.2.41133")
    assert [f.status for f in vendor_torch_findings(rocm_wheel, inventory)] == ["ok", "ok"]


def test_another_vendors_device_filter_set_here_is_a_warning() -> None:
    from allocator.doctor.checks import environment_findings

    (finding,) = environment_findings({"ROCR_VISIBLE_DEVICES": "0", "PATH": "/bin"})
    assert finding.status == "warn" and "ROCR_VISIBLE_DEVICES='0'" in finding.message
