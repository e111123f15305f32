"""``doctor``'s vendor checks: whose GPUs this host has, against the policy and PyTorch.

The NVIDIA checks (NVML, the CUDA driver against PyTorch's CUDA) stay in
:mod:`allocator.doctor.checks`; this module adds what every vendor shares: the
vendor found against the one the policy names for the host, the device
library's answer on a non-NVIDIA host, and the PyTorch build against the
vendor (a CUDA wheel on an AMD host is the ROCm-era "no kernel image is
available": one clear line, a failure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from allocator.doctor.findings import Finding, TorchReport
from allocator.gpus.inventory import Inventory, from_nvml
from allocator.gpus.vendors.registry import TorchBuild, vendor_named

if TYPE_CHECKING:  # the policy is the layer above: read here, never imported
    from allocator.policy.model import Policy

__all__ = ["LIBRARY", "device_library_findings", "vendor_findings", "vendor_torch_findings"]

#: What answered an inventory read, by its source, for messages.
LIBRARY = {"nvml": "NVML", "amdsmi": "amdsmi", "sysfs": "sysfs", "system": "the system"}


def vendor_findings(inventory: Inventory, policy: Policy | None, host: str) -> list[Finding]:
    """The vendor found here, and a failure when the policy names another for ``host``.

    Nothing for a host of the default vendor (NVIDIA's) the policy names no
    vendor for: the NVML finding says it all, as before vendors.
    """
    said = policy.vendor_of(host) if policy is not None else None
    if said is None and inventory.vendor == vendor_named(None).name:
        return []
    if not from_nvml(inventory):
        if said is not None:
            return [Finding("ok", "vendor", f"the policy says {said} GPUs; none found to compare")]
        return [Finding("ok", "vendor", "no GPU vendor found here")]
    found = inventory.vendor
    if said is not None and said != found:
        return [
            Finding(
                "fail",
                "vendor",
                f"the policy says {host} has {said} GPUs but this host has {found} GPUs",
                f"set vendor: {found} for {host} in the policy, or run doctor on the right host",
            )
        ]
    return [Finding("ok", "vendor", f"{found} GPUs" + (", as the policy says" if said else ""))]


def device_library_findings(inventory: Inventory) -> list[Finding]:
    """A non-NVIDIA host's device library and what it answered (its GPUs' errors are
    :func:`~allocator.doctor.checks.gpu_count_findings`'s)."""
    library = (
        "fake " + inventory.vendor
        if inventory.source == "fake"
        else LIBRARY.get(inventory.source, inventory.source)
    )
    driver = f"driver {inventory.driver_version}, " if inventory.driver_version else ""
    if not from_nvml(inventory):
        return [Finding("warn", "devices", inventory.error or "no GPUs found")]
    count = f"{len(inventory.gpus)} {inventory.vendor} GPU(s)"
    return [Finding("ok", "devices", f"{library}: {driver}{count}")]


def vendor_torch_findings(report: TorchReport, inventory: Inventory) -> list[Finding]:
    """PyTorch's build against a non-NVIDIA host's vendor."""
    build = TorchBuild(report.version, report.cuda, report.hip, report.xpu, report.mps)
    vendor = vendor_named(inventory.vendor)
    kind = f"ROCm {report.hip}" if report.hip else f"CUDA {report.cuda}" if report.cuda else "CPU"
    found = [Finding("ok", "torch", f"PyTorch {report.version} ({kind} build)")]
    problem = vendor.torch_build_problem(build)
    if problem is not None:
        return [*found, Finding("fail", "torch-build", problem)]
    return [
        *found,
        Finding(
            "ok", "torch-build", f"PyTorch drives {vendor.name} GPUs as {vendor.torch_device_type}"
        ),
    ]
