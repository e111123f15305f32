"""What ``doctor``'s checks return, and what PyTorch says about itself (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Finding", "Status", "TorchReport"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the doctor's report."""

    status: Status
    check: str
    message: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        """A JSON-ready dict."""
        return {
            "status": self.status,
            "check": self.check,
            "message": self.message,
            "hint": self.hint,
        }


@dataclass(frozen=True, slots=True)
class TorchReport:
    """What PyTorch said about itself in a subprocess."""

    version: str
    cuda: str | None
    available: bool
    device_count: int
    hip: str | None = None  # torch.version.hip: a ROCm build
    xpu: bool = False  # built with Intel XPU support
    mps: bool = False  # built with Apple's MPS backend
