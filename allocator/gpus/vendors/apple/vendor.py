"""Apple silicon: one ``mps`` device, nothing to mask.

A Mac's GPU is one device shared by every process (Metal has no per-process
device filter), so an Apple host offers one GPU, index 0, and a worker given
it simply uses ``mps``. No library is needed: the host is Apple silicon when
Python runs on macOS on arm64. The fake-GPU file with ``"vendor": "apple"``
stands in for that.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from allocator.errors import RequestError
from allocator.gpus.health import HealthMonitor
from allocator.gpus.inventory import Inventory, declared_inventory
from allocator.gpus.usage import UsageSampler
from allocator.gpus.vendors.base import (
    AmpFeature,
    CdiNames,
    HealthSource,
    NotSupported,
    TorchBuild,
    VendorName,
    join_indices,
)
from allocator.gpus.vendors.fake_file import FakeFileError, parse_fake_file
from allocator.records.gpu_info import GpuInfo

__all__ = ["APPLE", "MPS_AMP_SINCE", "Apple", "is_apple_silicon", "mps_amp_problem"]

#: The first PyTorch release whose MPS backend does each mixed-precision step.
#: autocast: pytorch/pytorch#99272, released in 2.5.0; before it,
#: ``torch.autocast("mps")`` raises "User specified an unsupported autocast
#: device_type 'mps'". GradScaler: ``step()`` raised "Cannot convert a MPS Tensor
#: to float64 dtype" (``unscale_`` inverted the scale in float64; pytorch/pytorch#142397)
#: until pytorch/pytorch#150255 gave MPS its unscale and update kernels and kept
#: the scale in float32 there, merged after 2.7's branch cut, so first in 2.8.0.
MPS_AMP_SINCE: dict[AmpFeature, tuple[int, int]] = {"autocast": (2, 5), "grad_scaler": (2, 8)}
_RELEASE = re.compile(r"([0-9]+)\.([0-9]+)")


def mps_amp_problem(feature: AmpFeature, version: str) -> str | None:
    """Why PyTorch ``version`` cannot do ``feature`` on ``mps`` (``None``: it can).

    ``version`` is ``torch.__version__`` (``2.7.1``, ``2.8.0a0+git...``); one
    that does not start with a release number is taken to be new enough.
    """
    match = _RELEASE.match(version)
    since = MPS_AMP_SINCE[feature]
    if match is None or (int(match[1]), int(match[2])) >= since:
        return None
    what = "autocast" if feature == "autocast" else "GradScaler.step()"
    return (
        f"PyTorch {version} cannot run {what} on mps (it needs PyTorch "
        f"{since[0]}.{since[1]} or newer); upgrade PyTorch"
    )


def is_apple_silicon(system: str | None = None, machine: str | None = None) -> bool:
    """Whether this is macOS on arm64 (arguments: ``platform.system()``/``machine()``)."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    return system == "Darwin" and machine == "arm64"


class Apple:
    """Apple's answers to :class:`~allocator.gpus.vendors.base.DeviceVendor`."""

    name: VendorName = "apple"
    display_name = "Apple"
    cdi_kind = ""  # containers on macOS run in a Linux VM with no GPU passed through
    torch_device_type = "mps"
    visibility_variables: tuple[str, ...] = ()
    device_groups: tuple[str, ...] = ()
    health_source: HealthSource = "inventory"
    keeps_indices = False
    cuda_driver_source: str | NotSupported = NotSupported("Apple GPUs have no CUDA driver")
    docker_gpus = False
    numbers_in_pci_order = False

    def read_inventory(self, declared_gpus: int | None, environ: Mapping[str, str]) -> Inventory:
        """One GPU on Apple silicon (or in the fake file); the declared count elsewhere."""
        mode = environ.get("ALLOCATOR_NVML", "")
        if mode.startswith("fake:"):
            path = mode.removeprefix("fake:")
            try:
                system = parse_fake_file(Path(path).read_bytes(), path)
            except (OSError, FakeFileError) as exc:
                return _declared(declared_gpus, str(exc))
            name = system.devices[0].name if system.devices else "Apple GPU"
            return Inventory(gpus=(GpuInfo(index=0, name=name),), source="fake", vendor="apple")
        if mode == "off" or not is_apple_silicon():
            return _declared(declared_gpus, "not Apple silicon")
        gpu = GpuInfo(index=0, name=f"Apple {platform.processor() or 'silicon'} GPU")
        return Inventory(gpus=(gpu,), source="system", vendor="apple")

    def device_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """``0``: the one GPU."""
        del known, prefer_uuid
        if list(gpus) != [0]:
            raise RequestError(f"an Apple host has one GPU, 0; not {list(gpus)}")
        return ["0"]

    def visible_env(self, ids: Sequence[str]) -> dict[str, str]:
        """Nothing: Metal has no device filter, and there is one device."""
        del ids
        return {}

    def order_env(self) -> dict[str, str]:
        """Nothing: its runtime numbers devices as its inventory does."""
        return {}

    def no_device_env(self) -> dict[str, str]:
        """Nothing to hide with: ``ALLOCATOR_DEVICE=cpu`` keeps the torch helpers off mps."""
        return {}

    def cdi_devices(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], naming: CdiNames
    ) -> list[str]:
        """None can be: no container engine on macOS passes the GPU through."""
        del known, naming
        raise RequestError(
            f"GPU {join_indices(gpus)} is an Apple GPU: no container engine passes it "
            "through (run the job as a host process, without container:)"
        )

    def container_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """As on the host (never reached: :meth:`cdi_devices` refuses)."""
        return self.device_ids(gpus, known, prefer_uuid)

    def container_env(self, ids: Sequence[str]) -> dict[str, str]:
        """Nothing, as on the host."""
        return self.visible_env(ids)

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """A PyTorch without MPS cannot use the GPU; one too old for mixed precision on it
        cannot train with :func:`allocator.torch.autocast` and ``grad_scaler``."""
        if not build.mps:
            return f"PyTorch {build.version} was built without MPS; install the macOS arm64 wheel"
        return mps_amp_problem("autocast", build.version) or mps_amp_problem(
            "grad_scaler", build.version
        )

    def amp_problem(self, feature: AmpFeature, torch_version: str) -> str | None:
        """An MPS backend too old for ``feature`` (:data:`MPS_AMP_SINCE`)."""
        return mps_amp_problem(feature, torch_version)

    def health_monitor(self, environ: Mapping[str, str]) -> HealthMonitor | None:
        """None: Apple's GPU reports no health signals between reads; a fresh inventory
        read's unreadable GPUs are its health (``health_source`` ``inventory``)."""
        return None

    def usage_sampler(
        self, environ: Mapping[str, str], clock: Callable[[], float]
    ) -> UsageSampler | None:
        """None: no usage is read from Apple's GPU (an unmeasured GPU is never taken for idle)."""
        return None


def _declared(declared_gpus: int | None, reason: str) -> Inventory:
    inventory = declared_inventory(declared_gpus, reason)
    return Inventory(inventory.gpus, inventory.source, error=inventory.error, vendor="apple")


APPLE = Apple()
