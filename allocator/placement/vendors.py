"""One job, one GPU vendor: a job across hosts never mixes vendors unless it says so (pure).

Ranks of one job run one collective library (NCCL, RCCL, oneCCL), which
does not span vendors, so a placement over hosts whose GPUs come from
different vendors is refused unless the job sets ``mix_vendors: true``. A
host's vendor is what its agent detected, else what the policy says.
"""

from __future__ import annotations

from collections.abc import Mapping

from allocator.errors import RequestError
from allocator.policy.model import Policy

__all__ = ["check_one_vendor", "host_vendor"]


def host_vendor(policy: Policy, host: str, detected: str | None) -> str | None:
    """The vendor of ``host``'s GPUs: the agent's finding, else the policy's (``None``: unknown)."""
    return detected or policy.vendor_of(host)


def check_one_vendor(policy: Policy, job: str, detected: Mapping[str, str | None]) -> None:
    """Refuse ``job`` on hosts of several vendors unless the job allows it.

    ``detected`` maps each host of the placement to its agent's vendor
    (``None`` or "" where no agent has said).
    """
    declared = policy.jobs.get(job)
    if declared is not None and declared.mix_vendors:
        return
    vendors = {host: host_vendor(policy, host, found) for host, found in detected.items()}
    if len({vendor for vendor in vendors.values() if vendor}) <= 1:
        return
    listed = ", ".join(f"{host} ({vendor or 'unknown'})" for host, vendor in vendors.items())
    raise RequestError(
        f"job {job!r}: hosts {listed} have GPUs of different vendors, and one job's ranks "
        "need one device runtime; pick hosts of one vendor, or set mix_vendors: true on the job"
    )
