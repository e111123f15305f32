"""The interface every vendor module implements, and what they share (pure).

One module per vendor (``nvidia``, ``amd``, ``intel``, ``apple``), in the
spirit of Ray's accelerator managers: each is the only place its device
library is imported, and each answers the same questions:

* what devices the host has, with stable ids (:meth:`DeviceVendor.read_inventory`);
* the environment that makes exactly a worker's devices visible, and the one
  that makes none visible (:meth:`DeviceVendor.visible_env`,
  :meth:`DeviceVendor.no_device_env`), from ids :meth:`DeviceVendor.device_ids`
  chooses;
* the CDI names of those devices, for container engines (:attr:`DeviceVendor.cdi_kind`);
* the PyTorch device type that drives them, and what is wrong with a PyTorch
  build for them (:meth:`DeviceVendor.torch_build_problem`, for ``doctor``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from allocator.errors import RequestError
from allocator.gpus.inventory import Inventory
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "VENDOR_NAMES",
    "DeviceVendor",
    "TorchBuild",
    "VendorName",
    "check_device_ids",
    "join_indices",
]

VendorName = Literal["nvidia", "amd", "intel", "apple"]
VENDOR_NAMES: tuple[VendorName, ...] = ("nvidia", "amd", "intel", "apple")


@dataclass(frozen=True, slots=True)
class TorchBuild:
    """What an installed PyTorch was built for (``torch.version``), as plain data."""

    version: str
    cuda: str | None  # torch.version.cuda: a CUDA build
    hip: str | None  # torch.version.hip: a ROCm build
    xpu: bool  # torch.xpu exists and was compiled in
    mps: bool  # torch.backends.mps.is_built()


class DeviceVendor(Protocol):
    """One vendor's devices, as the agent, the worker and ``doctor`` need them."""

    #: The vendor's name, as the policy, agent records and status write it.
    name: VendorName
    #: The CDI kind of its devices (``vendor.com/class``); "" where there is none.
    cdi_kind: str
    #: The PyTorch device type that drives its devices.
    torch_device_type: str
    #: Every variable its visibility environment sets: the agent never passes
    #: its own values of these to a worker.
    visibility_variables: tuple[str, ...]

    def read_inventory(self, declared_gpus: int | None, environ: Mapping[str, str]) -> Inventory:
        """The host's devices of this vendor; never raises for a missing library."""
        ...

    def device_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """Each assigned GPU's entry in the visibility variable, in assignment order."""
        ...

    def visible_env(self, ids: Sequence[str]) -> dict[str, str]:
        """The variables that make exactly ``ids`` visible, in that order."""
        ...

    def no_device_env(self) -> dict[str, str]:
        """The variables that make no device of this vendor visible (the CPU fallback)."""
        ...

    def cdi_devices(self, ids: Sequence[str]) -> list[str]:
        """The fully qualified CDI device names of ``ids`` (``kind=name``)."""
        ...

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """Why this PyTorch cannot drive this vendor's devices (``None``: it can)."""
        ...


def check_device_ids(gpus: Sequence[int], ids: Sequence[str], pattern: re.Pattern[str]) -> None:
    """Refuse ids a runtime would misparse (a space, a comma) or the same device twice."""
    for gpu, device_id in zip(gpus, ids, strict=True):
        if not pattern.match(device_id):
            raise RequestError(f"GPU {gpu} has an unusable device id {device_id!r}")
    if len(set(ids)) != len(ids):
        listed = join_indices(gpus)
        raise RequestError(f"GPUs {listed} resolve to a repeated device id: {list(ids)}")


def join_indices(values: Sequence[int]) -> str:
    """``0,2,3``."""
    return ",".join(str(v) for v in values)
