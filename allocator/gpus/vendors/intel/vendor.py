"""Intel GPUs: sysfs for inventory, ``ZE_AFFINITY_MASK`` for visibility, torch's ``xpu``.

Inventory comes from ``/sys/class/drm/card<N>``: a card whose PCI vendor
(``device/vendor``) is ``0x8086`` is an Intel GPU; its PCI address (the
``PCI_SLOT_NAME`` of ``device/uevent``) is its stable id, and cards are
numbered in PCI order. sysfs needs no library; the fake
(:class:`FakeSysfs`) lays the same paths out from the fake-GPU file when it
says ``"vendor": "intel"``.

Visibility goes through Level Zero, under both oneAPI's SYCL runtime and
PyTorch's ``xpu``: ``ZE_AFFINITY_MASK`` lists the GPUs by index, with
``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1`` so Level Zero's indices are PCI order
(the order above) and ``ZE_FLAT_DEVICE_HIERARCHY=COMPOSITE`` so a card with
two tiles is one device, as it is one GPU here. SYCL code gets
``ONEAPI_DEVICE_SELECTOR=level_zero:*``: every Level Zero device the mask
left, so nothing filters a second time with physical numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from allocator.errors import RequestError
from allocator.gpus.health import HealthMonitor
from allocator.gpus.inventory import Inventory, InventorySource, declared_inventory
from allocator.gpus.usage import UsageSampler
from allocator.gpus.vendors.base import (
    AmpFeature,
    CdiNames,
    HealthSource,
    NotSupported,
    TorchBuild,
    VendorName,
    check_device_ids,
    container_indices,
)
from allocator.gpus.vendors.fake_file import FakeFileError, FakeSystem, parse_fake_file
from allocator.records.gpu_info import GpuInfo

__all__ = ["INTEL", "FakeSysfs", "Intel", "RealSysfs", "Sysfs", "read_intel_gpus"]

INTEL_PCI_VENDOR = "0x8086"
_CARD = re.compile(r"card[0-9]+\Z")  # not card0-DP-1 (a connector) nor renderD128
_INDEX = re.compile(r"[0-9]+\Z")


class Sysfs(Protocol):
    """The little of sysfs the reader needs (paths relative to ``/sys``)."""

    def listdir(self, path: str) -> list[str]:
        """Entries of a directory (empty if it is not there)."""
        ...

    def read(self, path: str) -> str | None:
        """A file's text (``None`` if it is not there)."""
        ...


class RealSysfs:
    """sysfs under ``root`` (``/sys``; a directory laid out like it in tests)."""

    def __init__(self, root: str | Path = "/sys") -> None:
        """Read below ``root``."""
        self.root = Path(root)

    def listdir(self, path: str) -> list[str]:
        """Entries of a directory (empty if it is not there)."""
        try:
            return sorted(entry.name for entry in (self.root / path).iterdir())
        except OSError:
            return []

    def read(self, path: str) -> str | None:
        """A file's text (``None`` if it is not there)."""
        try:
            return (self.root / path).read_text()
        except OSError:
            return None


class FakeSysfs:
    """The drm cards of a fake-GPU file, at sysfs's paths (a lost GPU has none)."""

    def __init__(self, system: FakeSystem) -> None:
        """Lay the file's devices out as ``class/drm/card<index>``."""
        self.files: dict[str, str] = {}
        for device in system.devices:
            if device.lost:
                continue
            card = f"class/drm/card{device.index}"
            self.files[f"{card}/device/vendor"] = f"{INTEL_PCI_VENDOR}\n"
            self.files[f"{card}/device/device"] = "0x56c0\n"
            slot = device.pci_bus_id[-12:].lower()
            self.files[f"{card}/device/uevent"] = f"DRIVER=i915\nPCI_SLOT_NAME={slot}\n"
            if device.numa_node is not None:
                self.files[f"{card}/device/numa_node"] = f"{device.numa_node}\n"
            self.files[f"class/drm/card{device.index}-DP-1/status"] = "disconnected\n"

    def listdir(self, path: str) -> list[str]:
        """Entries of a directory (empty if it is not there)."""
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/")[0] for p in self.files if p.startswith(prefix)})

    def read(self, path: str) -> str | None:
        """A file's text (``None`` if it is not there)."""
        return self.files.get(path)


def read_intel_gpus(sysfs: Sysfs) -> tuple[GpuInfo, ...]:
    """Every Intel GPU sysfs shows, indexed in PCI order."""
    found: list[tuple[str, str, int | None, int]] = []
    for card in sysfs.listdir("class/drm"):
        if not _CARD.match(card):
            continue
        base = f"class/drm/{card}/device"
        if (sysfs.read(f"{base}/vendor") or "").strip().lower() != INTEL_PCI_VENDOR:
            continue
        slot = _uevent(sysfs.read(f"{base}/uevent") or "").get("PCI_SLOT_NAME", "")
        device_id = (sysfs.read(f"{base}/device") or "").strip()
        numa = (sysfs.read(f"{base}/numa_node") or "").strip()
        number = int(card.removeprefix("card"))
        found.append((slot, device_id, int(numa) if _INDEX.match(numa) else None, number))
    found.sort()
    return tuple(
        GpuInfo(
            index=index,
            pci_bus_id=slot or None,
            name=f"Intel GPU {device_id}" if device_id else "Intel GPU",
            numa_node=numa,
            drm_card=number,
            pci_device_id=device_id or None,
        )
        for index, (slot, device_id, numa, number) in enumerate(found)
    )


def _uevent(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value for key, value in pairs}


class Intel:
    """Intel's answers to :class:`~allocator.gpus.vendors.base.DeviceVendor`."""

    name: VendorName = "intel"
    display_name = "Intel"
    cdi_kind = "intel.com/gpu"
    torch_device_type = "xpu"
    visibility_variables: tuple[str, ...] = (
        "ZE_AFFINITY_MASK",
        "ZE_ENABLE_PCI_ID_DEVICE_ORDER",
        "ZE_FLAT_DEVICE_HIERARCHY",
        "ONEAPI_DEVICE_SELECTOR",
    )
    # /dev/dri/renderD* is group render, card* group video (Intel's container guides:
    # --group-add with the render node's GID).
    device_groups: tuple[str, ...] = ("render", "video")
    health_source: HealthSource = "inventory"
    keeps_indices = False
    cuda_driver_source: str | NotSupported = NotSupported("Intel GPUs have no CUDA driver")
    docker_gpus = False
    numbers_in_pci_order = True

    def read_inventory(self, declared_gpus: int | None, environ: Mapping[str, str]) -> Inventory:
        """sysfs's (or the fake's) Intel GPUs; the declared count when there are none."""
        mode = environ.get("ALLOCATOR_NVML", "")
        if mode == "off":
            return _declared(declared_gpus, "device libraries disabled (ALLOCATOR_NVML=off)")
        source: InventorySource = "fake" if mode.startswith("fake:") else "sysfs"
        try:
            sysfs = _fake_sysfs(mode.removeprefix("fake:")) if source == "fake" else RealSysfs()
        except (OSError, FakeFileError) as exc:
            return _declared(declared_gpus, str(exc))
        gpus = read_intel_gpus(sysfs)
        if not gpus:
            return _declared(declared_gpus, "no Intel GPU in /sys/class/drm")
        return Inventory(gpus=gpus, source=source, vendor="intel")

    def device_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """Level Zero indices (PCI order); sysfs knows no UUID."""
        del known, prefer_uuid
        ids = [str(gpu) for gpu in gpus]
        check_device_ids(gpus, ids, _INDEX)
        return ids

    def visible_env(self, ids: Sequence[str]) -> dict[str, str]:
        """The Level Zero mask, its ordering, and SYCL's selector over what it left."""
        return {
            "ZE_AFFINITY_MASK": ",".join(ids),
            "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
            "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE",
            "ONEAPI_DEVICE_SELECTOR": "level_zero:*",
        }

    def order_env(self) -> dict[str, str]:
        """Nothing apart: :meth:`visible_env` sets Level Zero's PCI ordering with the mask."""
        return {}

    def no_device_env(self) -> dict[str, str]:
        """SYCL (and so PyTorch's xpu) sees the CPU only."""
        return {"ONEAPI_DEVICE_SELECTOR": "opencl:cpu"}

    def cdi_devices(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], naming: CdiNames
    ) -> list[str]:
        """``intel.com/gpu=card<N>`` (the DRM card, as intel-device-plugins' CDI
        generator names it) or, under ``pci``, the DRA driver's id
        (intel-resource-drivers-for-kubernetes ``DeviceUIDFromPCIinfo``:
        ``0000:03:00.0`` and ``0x56c0`` make ``0000-03-00-0-0x56c0``)."""
        return [f"{self.cdi_kind}={_cdi_name(gpu, known.get(gpu), naming)}" for gpu in gpus]

    def container_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """The container's numbers: Level Zero renumbers what it sees from 0, in PCI order."""
        del known, prefer_uuid
        return container_indices(gpus)

    def container_env(self, ids: Sequence[str]) -> dict[str, str]:
        """As on the host, with the container's numbers."""
        return self.visible_env(ids)

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """A PyTorch without XPU support cannot drive Intel GPUs."""
        if build.xpu:
            return None
        return (
            f"PyTorch {build.version} was built without XPU support on an Intel GPU host; "
            "install PyTorch's XPU build (https://pytorch.org/get-started/locally/)"
        )

    def amp_problem(self, feature: AmpFeature, torch_version: str) -> str | None:
        """None: PyTorch's XPU backend runs autocast and GradScaler wherever it is built."""
        return None

    def health_monitor(self, environ: Mapping[str, str]) -> HealthMonitor | None:
        """None: sysfs reports no health signals between reads; a fresh inventory
        read's unreadable GPUs are its health (``health_source`` ``inventory``)."""
        return None

    def usage_sampler(
        self, environ: Mapping[str, str], clock: Callable[[], float]
    ) -> UsageSampler | None:
        """None: no usage is read from sysfs (an unmeasured GPU is never taken for idle)."""
        return None


def _cdi_name(gpu: int, info: GpuInfo | None, naming: CdiNames) -> str:
    if naming == "pci":
        if info is None or not info.pci_bus_id or not info.pci_device_id:
            raise RequestError(
                f"Intel GPU {gpu}: its PCI address and device id are unknown, and this "
                "host's CDI spec (cdi_names: pci) names GPUs by them"
            )
        address = info.pci_bus_id.lower().replace(":", "-").replace(".", "-")
        return f"{address}-{info.pci_device_id.lower()}"
    if info is None or info.drm_card is None:
        raise RequestError(
            f"Intel GPU {gpu}: its DRM card number is unknown (no sysfs inventory), and "
            "Intel's CDI spec names GPUs card<N>"
        )
    return f"card{info.drm_card}"


def _fake_sysfs(path: str) -> FakeSysfs:
    return FakeSysfs(parse_fake_file(Path(path).read_bytes(), path))


def _declared(declared_gpus: int | None, reason: str) -> Inventory:
    inventory = declared_inventory(declared_gpus, reason)
    return Inventory(inventory.gpus, inventory.source, error=inventory.error, vendor="intel")


INTEL = Intel()
