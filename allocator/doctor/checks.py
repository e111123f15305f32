"""``allocator doctor``'s checks, as data: each check returns :class:`Finding` values.

The CLI prints the findings and passes in the store and agent checks; the
GPU-side checks live here: NVML reachable (driver version), the GPU count
NVML sees against the policy's declaration for this host, variables in the
calling environment that would fight the agent's, and, where PyTorch is
installed, its CUDA build against the driver and whether
``torch.cuda.is_available()`` agrees with NVML. PyTorch is never imported
in this process: it is asked in a subprocess with a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from allocator.doctor.findings import Finding, Status, TorchReport
from allocator.gpus.inventory import Inventory, cuda_version_text
from allocator.gpus.probe import run_deep_probe

if TYPE_CHECKING:  # the policy is the layer above: read here, never imported
    from allocator.policy.model import Policy

__all__ = [
    "Finding",
    "Status",
    "TorchReport",
    "environment_findings",
    "gpu_count_findings",
    "nvml_findings",
    "overall",
    "probe_torch",
    "run_checks",
    "torch_findings",
]

_RANK: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}
_REPORT_MARK = "ALLOCATOR-TORCH-REPORT "
_TORCH_SCRIPT = (
    "import json, torch\n"
    "xpu = hasattr(torch, 'xpu') and torch.xpu._is_compiled()\n"
    "print(" + repr(_REPORT_MARK) + " + json.dumps({'version': torch.__version__,"
    " 'cuda': torch.version.cuda, 'available': torch.cuda.is_available(),"
    " 'count': torch.cuda.device_count(), 'hip': getattr(torch.version, 'hip', None),"
    " 'xpu': xpu, 'mps': torch.backends.mps.is_built()}))\n"
)
_DEVICE_FILTERS = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ONEAPI_DEVICE_SELECTOR",
)
_NVML_HINT = (
    "install the NVIDIA driver and nvidia-ml-py (pip install 'gpu-allocator[nvml]'), "
    "or declare this host's GPUs in the policy"
)


def overall(findings: Sequence[Finding]) -> Status:
    """The worst status among ``findings`` (``ok`` for none)."""
    return max((f.status for f in findings), key=_RANK.__getitem__, default="ok")


def run_checks(
    policy: Policy | None,
    host: str,
    environ: Mapping[str, str],
    store_check: Callable[[], Finding] | None,
    agent_check: Callable[[], Finding] | None,
    *,
    check_torch: bool = True,
    torch_timeout: float = 60.0,
) -> list[Finding]:
    """Run every check for ``host`` and return the findings in report order."""
    from allocator.doctor.vendor_checks import (
        device_library_findings,
        vendor_findings,
        vendor_torch_findings,
    )
    from allocator.gpus.vendors.base import NotSupported
    from allocator.gpus.vendors.registry import read_host_inventory, vendor_named

    declared = _declared_count(policy, host)
    said = policy.vendor_of(host) if policy is not None else None
    inventory = read_host_inventory(declared, environ=environ, vendor=said)
    # A CUDA driver's vendor (NVML) has its own library and PyTorch checks.
    cuda = not isinstance(vendor_named(inventory.vendor).cuda_driver_source, NotSupported)
    library = nvml_findings(inventory, declared, environ) if cuda else []
    findings = [
        *vendor_findings(inventory, policy, host),
        *(library or device_library_findings(inventory)),
        *gpu_count_findings(inventory, policy, host),
        *environment_findings(environ),
    ]
    if check_torch:
        report = probe_torch(environ, torch_timeout)
        if cuda or report is None or isinstance(report, str):
            findings.extend(torch_findings(report, inventory))
        else:
            findings.extend(vendor_torch_findings(report, inventory))
    for name, check in (("store", store_check), ("agent", agent_check)):
        if check is not None:
            findings.append(_run_passed_check(name, check))
    return findings


def _declared_count(policy: Policy | None, host: str) -> int | None:
    declared = policy.hosts.get(host) if policy is not None else None
    return declared.gpus if declared is not None else None


def _run_passed_check(name: str, check: Callable[[], Finding]) -> Finding:
    try:
        return check()
    except Exception as exc:
        # A doctor reports what is broken; it must not become the breakage.
        return Finding("fail", name, f"{type(exc).__name__}: {exc}")


def _nvml_working(inventory: Inventory) -> bool:
    """Whether a device library answered (NVML on NVIDIA hosts; amdsmi, sysfs... elsewhere)."""
    return inventory.source in ("nvml", "fake", "amdsmi", "sysfs", "system")


def nvml_findings(
    inventory: Inventory, declared: int | None, environ: Mapping[str, str]
) -> list[Finding]:
    """NVML reachable, with driver and CUDA versions."""
    if _nvml_working(inventory):
        where = " (fake NVML)" if inventory.source == "fake" else ""
        cuda = cuda_version_text(inventory.cuda_driver_version) or "unknown"
        return [
            Finding(
                "ok",
                "nvml",
                f"NVML{where}: driver {inventory.driver_version or 'unknown'}, supports CUDA "
                f"{cuda}, {len(inventory.gpus)} GPU(s)",
            )
        ]
    message = inventory.error or "no GPUs found"
    if environ.get("ALLOCATOR_NVML") == "off" or not declared:
        return [Finding("warn", "nvml", message, _NVML_HINT)]
    return [Finding("fail", "nvml", message, _NVML_HINT)]


def gpu_count_findings(inventory: Inventory, policy: Policy | None, host: str) -> list[Finding]:
    """The GPUs NVML sees against the policy's declared count for ``host``."""
    if policy is None:
        return [Finding("warn", "gpus", "no policy: cannot compare with a declared GPU count")]
    declared = policy.hosts.get(host)
    if declared is None:
        return [
            Finding(
                "warn",
                "gpus",
                f"host {host} is not declared in the policy",
                "add it under hosts: with its GPU count",
            )
        ]
    if not _nvml_working(inventory):
        return [
            Finding(
                "warn",
                "gpus",
                f"NVML unavailable: using the policy's {declared.gpus} declared GPU(s), "
                "indices only, no health checks",
            )
        ]
    return [_count_finding(len(inventory.gpus), declared.gpus, host), *_broken_gpus(inventory)]


def _count_finding(seen: int, declared: int, host: str) -> Finding:
    if seen == declared:
        return Finding("ok", "gpus", f"NVML sees {seen} GPU(s), as the policy declares for {host}")
    if seen < declared:
        return Finding(
            "fail",
            "gpus",
            f"the policy declares {declared} GPU(s) on {host} but NVML sees {seen}",
            "a GPU may have fallen off the bus (look for XID 79 in dmesg), or fix the policy",
        )
    return Finding(
        "warn",
        "gpus",
        f"NVML sees {seen} GPU(s) on {host} but the policy declares {declared}: "
        f"GPU(s) {declared}-{seen - 1} are never assigned",
        "declare the host's real GPU count in the policy",
    )


def _broken_gpus(inventory: Inventory) -> list[Finding]:
    return [
        Finding("fail", "gpus", f"GPU {gpu.index} does not answer NVML: {gpu.error}")
        for gpu in inventory.gpus
        if gpu.error
    ]


def environment_findings(environ: Mapping[str, str]) -> list[Finding]:
    """Variables already set here that would fight the ones the agent sets per worker."""
    conflicts: list[str] = []
    for name in _DEVICE_FILTERS:  # every vendor's: the agent strips and sets them per worker
        if name in environ:
            conflicts.append(f"{name}={environ[name]!r}")
    order = environ.get("CUDA_DEVICE_ORDER")
    if order is not None and order != "PCI_BUS_ID":
        conflicts.append(f"CUDA_DEVICE_ORDER={order!r} (the agent uses PCI_BUS_ID)")
    if not conflicts:
        return [Finding("ok", "environment", "no CUDA device selection set in this environment")]
    return [
        Finding(
            "warn",
            "environment",
            "already set here: " + ", ".join(conflicts),
            "unset them where the agent runs (systemd unit, compose file): the agent sets "
            "them per worker, and anything started by hand from here inherits these",
        )
    ]


def probe_torch(
    environ: Mapping[str, str], timeout: float, *, command: Sequence[str] | None = None
) -> TorchReport | str | None:
    """Ask PyTorch about itself in a subprocess; ``None`` if it is not installed.

    Returns the report, or a one-line error (timed out, crashed, bad output).
    The subprocess sees every GPU (``CUDA_VISIBLE_DEVICES`` removed) so its
    answer is comparable with NVML's.
    """
    if command is None and importlib.util.find_spec("torch") is None:
        return None
    env = {k: v for k, v in environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    argv = list(command) if command is not None else [sys.executable, "-c", _TORCH_SCRIPT]
    result = run_deep_probe(env, timeout, argv)
    if not result.ok:
        return f"asking PyTorch failed: {result.reason}"
    return _parse_report(result.output)


def _parse_report(output: str) -> TorchReport | str:
    for line in output.splitlines():
        if line.startswith(_REPORT_MARK):
            try:
                data: Any = json.loads(line.removeprefix(_REPORT_MARK))
                return TorchReport(
                    version=str(data["version"]),
                    cuda=str(data["cuda"]) if data["cuda"] else None,
                    available=bool(data["available"]),
                    device_count=int(data["count"]),
                    hip=str(data["hip"]) if data.get("hip") else None,
                    xpu=bool(data.get("xpu")),
                    mps=bool(data.get("mps")),
                )
            except (ValueError, KeyError, TypeError) as exc:
                return f"unreadable PyTorch report: {exc}"
    return "PyTorch printed no report"


def torch_findings(report: TorchReport | str | None, inventory: Inventory) -> list[Finding]:
    """PyTorch's CUDA build against the driver, and its view of the GPUs against NVML's."""
    if report is None:
        return [Finding("ok", "torch", "PyTorch is not installed here; its checks are skipped")]
    if isinstance(report, str):
        return [
            Finding(
                "fail",
                "torch",
                report,
                "run python -c 'import torch; print(torch.cuda.is_available())' to see why",
            )
        ]
    build = f"CUDA {report.cuda}" if report.cuda else "CPU-only"
    return [
        Finding("ok", "torch", f"PyTorch {report.version} ({build} build)"),
        _build_finding(report, inventory),
        _available_finding(report, inventory),
    ]


def _version_pair(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _build_finding(report: TorchReport, inventory: Inventory) -> Finding:
    gpus = len(inventory.gpus) if _nvml_working(inventory) else 0
    if report.cuda is None:
        if gpus:
            return Finding(
                "fail",
                "torch-cuda",
                f"PyTorch is a CPU-only build but NVML sees {gpus} GPU(s)",
                "install a CUDA build of PyTorch",
            )
        return Finding("ok", "torch-cuda", "CPU-only PyTorch build, no GPUs here")
    built = _version_pair(report.cuda)
    driver = inventory.cuda_driver_version
    if built is None or driver is None:
        return Finding(
            "warn", "torch-cuda", f"cannot compare PyTorch's CUDA {report.cuda} with the driver"
        )
    supported = (driver // 1000, (driver % 1000) // 10)
    return _compare_cuda(report.cuda, built, supported)


def _compare_cuda(text: str, built: tuple[int, int], supported: tuple[int, int]) -> Finding:
    limit = f"{supported[0]}.{supported[1]}"
    hint = f"upgrade the NVIDIA driver, or install a PyTorch built for CUDA {limit} or older"
    if built[0] > supported[0]:
        return Finding(
            "fail",
            "torch-cuda",
            f"PyTorch is built for CUDA {text}; the driver supports CUDA {limit} at most",
            hint,
        )
    if built > supported:
        return Finding(
            "warn",
            "torch-cuda",
            f"PyTorch is built for CUDA {text}, newer than the driver's {limit}: it relies on "
            "CUDA minor-version compatibility (kernels needing PTX JIT may fail)",
            hint,
        )
    return Finding("ok", "torch-cuda", f"PyTorch's CUDA {text} runs on the driver's CUDA {limit}")


def _available_finding(report: TorchReport, inventory: Inventory) -> Finding:
    if not _nvml_working(inventory):
        if report.available:
            return Finding(
                "warn",
                "torch-gpus",
                f"PyTorch sees {report.device_count} CUDA device(s) but NVML is unavailable",
            )
        return Finding("ok", "torch-gpus", "no CUDA devices for PyTorch, nor for NVML")
    gpus = len(inventory.gpus)
    if gpus and not report.available:
        return Finding(
            "fail",
            "torch-gpus",
            f"NVML sees {gpus} GPU(s) but torch.cuda.is_available() is False",
            "check the PyTorch build and the driver (see the torch-cuda finding)",
        )
    if report.available and report.device_count != gpus:
        return Finding(
            "warn",
            "torch-gpus",
            f"PyTorch sees {report.device_count} CUDA device(s), NVML sees {gpus}",
        )
    return Finding("ok", "torch-gpus", f"PyTorch and NVML agree: {gpus} GPU(s)")
