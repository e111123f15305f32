"""The interface every vendor module implements, and what they share (pure).

One module per vendor (``nvidia``, ``amd``, ``intel``, ``apple``), in the
spirit of Ray's accelerator managers: each is the only place its device
library is imported, and each answers the same questions:

* what devices the host has, with stable ids (:meth:`DeviceVendor.read_inventory`);
* the environment that makes exactly a worker's devices visible, and the one
  that makes none visible (:meth:`DeviceVendor.visible_env`,
  :meth:`DeviceVendor.no_device_env`), from ids :meth:`DeviceVendor.device_ids`
  chooses;
* the CDI names of those devices, as the vendor's own spec generator writes
  them (:meth:`DeviceVendor.cdi_devices`), and the ids a container that holds
  exactly them numbers them by (:meth:`DeviceVendor.container_ids`);
* the PyTorch device type that drives them, and what is wrong with a PyTorch
  build for them (:meth:`DeviceVendor.torch_build_problem`, for ``doctor``), or
  with its mixed precision on them (:meth:`DeviceVendor.amp_problem`);
* their health and usage between reads: the monitor and the sampler the agent
  keeps (:meth:`DeviceVendor.health_monitor`, :meth:`DeviceVendor.usage_sampler`),
  ``None`` where its library reports neither.

A vendor with no source for a part answers :class:`NotSupported` for it, so no
caller branches on a vendor's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from allocator.errors import RequestError
from allocator.gpus.health import HealthMonitor
from allocator.gpus.inventory import Inventory
from allocator.gpus.usage import UsageSampler
from allocator.records.gpu_info import GpuInfo

__all__ = [
    "VENDOR_NAMES",
    "AmpFeature",
    "CdiNames",
    "DeviceVendor",
    "HealthSource",
    "NotSupported",
    "TorchBuild",
    "VendorName",
    "check_device_ids",
    "container_indices",
    "join_indices",
]

VendorName = Literal["nvidia", "amd", "intel", "apple"]
VENDOR_NAMES: tuple[VendorName, ...] = ("nvidia", "amd", "intel", "apple")
#: How a host's CDI spec names devices where its vendor's generators differ (Intel:
#: ``card<N>`` from its device plugins' generator, or the DRA driver's PCI-based id).
CdiNames = Literal["card", "pci"]
#: Where a vendor's health verdicts come from (:attr:`DeviceVendor.health_source`).
HealthSource = Literal["signals", "inventory"]
#: A mixed-precision step :mod:`allocator.torch` sets up (:meth:`DeviceVendor.amp_problem`).
AmpFeature = Literal["autocast", "grad_scaler"]


@dataclass(frozen=True, slots=True)
class NotSupported:
    """A vendor's answer for a part it has no source for: the caller falls back,
    and ``reason`` says why (for its logs and messages)."""

    reason: str


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
    #: Its name as a sentence writes it (``AMD``), for messages.
    display_name: str
    #: The CDI kind of its devices (``vendor.com/class``); "" where there is none.
    cdi_kind: str
    #: The PyTorch device type that drives its devices.
    torch_device_type: str
    #: Every variable its visibility environment sets: the agent never passes
    #: its own values of these to a worker.
    visibility_variables: tuple[str, ...]
    #: The host groups owning its device nodes (which a container keeps): a
    #: container's non-root user must be in them to open its GPUs.
    device_groups: tuple[str, ...]
    #: Where its health comes from: ``signals`` a monitor watches between reads
    #: (NVML's XIDs and error counters), or ``inventory``: it has no such source,
    #: and a fresh read's unreadable GPUs are all it says.
    health_source: HealthSource
    #: Whether its library keeps every GPU's index when one fails (NVML does;
    #: amdsmi and sysfs renumber, so a GPU is known again by its address).
    keeps_indices: bool
    #: Whether docker's ``--gpus`` (NVIDIA's container toolkit) hands it its devices.
    docker_gpus: bool
    #: Whether its runtime numbers the visible devices in PCI order whatever order
    #: the mask lists them in (Level Zero): a worker's GPUs are then listed sorted.
    numbers_in_pci_order: bool
    #: The library that reports its driver's CUDA version (NVML), which ``doctor``
    #: checks against PyTorch's CUDA; :class:`NotSupported` where its GPUs have no
    #: CUDA driver (``doctor`` then reports its device library and PyTorch build alone).
    cuda_driver_source: str | NotSupported

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

    def order_env(self) -> dict[str, str]:
        """The variables that make its runtime number devices as the inventory does."""
        ...

    def no_device_env(self) -> dict[str, str]:
        """The variables that make no device of this vendor visible (the CPU fallback)."""
        ...

    def cdi_devices(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], naming: CdiNames
    ) -> list[str]:
        """The fully qualified CDI names (``kind=name``) of ``gpus``, as the vendor's
        generator names them; :class:`RequestError` where none can be formed."""
        ...

    def container_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """The visibility entries of ``gpus`` inside a container holding exactly them."""
        ...

    def container_env(self, ids: Sequence[str]) -> dict[str, str]:
        """:meth:`visible_env` for a container, whose devices the engine injected."""
        ...

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """Why this PyTorch cannot drive this vendor's devices (``None``: it can)."""
        ...

    def amp_problem(self, feature: AmpFeature, torch_version: str) -> str | None:
        """Why PyTorch ``torch_version`` cannot run ``feature`` here (``None``: it can)."""
        ...

    def health_monitor(self, environ: Mapping[str, str]) -> HealthMonitor | None:
        """A monitor of its health signals for the agent to keep, through the library
        ``environ`` selects; ``None`` where it has none (``health_source`` ``inventory``)."""
        ...

    def usage_sampler(
        self, environ: Mapping[str, str], clock: Callable[[], float]
    ) -> UsageSampler | None:
        """A sampler of its GPUs' usage for the agent to keep, through the library
        ``environ`` selects; ``None`` where its library reports none."""
        ...


def check_device_ids(gpus: Sequence[int], ids: Sequence[str], pattern: re.Pattern[str]) -> None:
    """Refuse ids a runtime would misparse (a space, a comma) or the same device twice."""
    for gpu, device_id in zip(gpus, ids, strict=True):
        if not pattern.match(device_id):
            raise RequestError(f"GPU {gpu} has an unusable device id {device_id!r}")
    if len(set(ids)) != len(ids):
        listed = join_indices(gpus)
        raise RequestError(f"GPUs {listed} resolve to a repeated device id: {list(ids)}")


def container_indices(gpus: Sequence[int]) -> list[str]:
    """Each GPU's number inside a container holding exactly ``gpus``.

    Runtimes number what they can see from 0 in PCI order (CUDA with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, Level Zero with PCI ordering), and host
    indices are PCI order too: a GPU's number is its rank among ``gpus``.
    """
    rank = {gpu: str(position) for position, gpu in enumerate(sorted(gpus))}
    return [rank[gpu] for gpu in gpus]


def join_indices(values: Sequence[int]) -> str:
    """``0,2,3``."""
    return ",".join(str(v) for v in values)
