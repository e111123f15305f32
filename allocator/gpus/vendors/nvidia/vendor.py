"""NVIDIA GPUs: NVML for inventory and health, ``CUDA_VISIBLE_DEVICES`` for visibility.

NVML itself stays in :mod:`allocator.gpus.vendors.nvidia.nvml` (the one module importing
``pynvml``), with inventory, health, topology and usage built on it; this
module is NVIDIA's face in the vendor layer.

Visibility rules (from how CUDA reads its environment):

* ``CUDA_VISIBLE_DEVICES`` lists the GPUs in the assignment's order (CUDA
  renumbers visible devices from 0 in listed order): GPU UUIDs when the
  policy says ``visible_devices: uuid`` and every assigned GPU's UUID is
  known, else NVML indices; never both, never a duplicate, never a space;
  ``NVIDIA_VISIBLE_DEVICES`` repeats the list for containers.
* A GPU in MIG mode is handed out as its first MIG instance's UUID
  (``MIG-...``), under ``index`` too, since an index cannot name a MIG instance.
* No device: ``CUDA_VISIBLE_DEVICES=""`` (never unset, never ``-1``) and
  ``NVIDIA_VISIBLE_DEVICES=void``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

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
    check_device_ids,
    container_indices,
)
from allocator.gpus.vendors.nvidia.health import NvmlHealthMonitor
from allocator.gpus.vendors.nvidia.nvml import (
    NvmlUnavailable,
    load_nvml,
    nvml_session,
    read_devices,
    source_kind,
)
from allocator.gpus.vendors.nvidia.usage import NvmlUsageSampler
from allocator.records.gpu_info import GpuInfo

__all__ = ["NVIDIA", "Nvidia", "read_inventory"]

# An index, a GPU-/MIG- UUID, or MIG-GPU-<uuid>/<gi>/<ci>: nothing CUDA would split or trim.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_-]*\Z")
_INDEX = re.compile(r"[0-9]+\Z")


def read_inventory(
    declared_gpus: int | None = None, *, environ: Mapping[str, str] | None = None
) -> Inventory:
    """Read the GPUs NVML sees, or fall back to ``declared_gpus`` (the policy's count).

    ``environ`` (default ``os.environ``) is consulted for ``ALLOCATOR_NVML``
    (``off``, or ``fake:PATH``). Never raises for a missing or failing NVML.
    """
    env = os.environ if environ is None else environ
    try:
        lib = load_nvml(env)
    except NvmlUnavailable as exc:
        return declared_inventory(declared_gpus, str(exc))
    try:
        with nvml_session(lib):
            reading = read_devices(lib)
    except NvmlUnavailable as exc:
        return declared_inventory(declared_gpus, str(exc))
    except lib.NVMLError as exc:
        # A call failing after init (driver gone mid-read, fake file broken
        # mid-read): still "no GPUs found", with why.
        return declared_inventory(declared_gpus, f"NVML failed: {exc}")
    return Inventory(
        gpus=reading.gpus,
        source=source_kind(env),
        driver_version=reading.driver_version,
        cuda_driver_version=reading.cuda_driver_version,
    )


class Nvidia:
    """NVIDIA's answers to :class:`~allocator.gpus.vendors.base.DeviceVendor`."""

    name: VendorName = "nvidia"
    display_name = "NVIDIA"
    cdi_kind = "nvidia.com/gpu"
    torch_device_type = "cuda"
    visibility_variables: tuple[str, ...] = (
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    )
    device_groups: tuple[str, ...] = ()  # /dev/nvidia* are 0666: any user opens them
    health_source: HealthSource = "signals"
    keeps_indices = True
    cuda_driver_source: str | NotSupported = "NVML"
    docker_gpus = True
    numbers_in_pci_order = False

    def read_inventory(self, declared_gpus: int | None, environ: Mapping[str, str]) -> Inventory:
        """NVML's (or the fake NVML's) inventory; the declared count when NVML fails."""
        return read_inventory(declared_gpus, environ=environ)

    def device_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """``CUDA_VISIBLE_DEVICES`` entries: UUIDs, MIG UUIDs or NVML indices."""
        plain = [gpu for gpu in gpus if gpu not in known or not known[gpu].mig_enabled]
        use_uuid = prefer_uuid and all(gpu in known and known[gpu].uuid for gpu in plain)
        ids: list[str] = []
        for gpu in gpus:
            info = known.get(gpu)
            if info is not None and info.mig_enabled:
                if not info.mig_devices:
                    raise RequestError(f"GPU {gpu} is in MIG mode but has no MIG instance")
                ids.append(info.mig_devices[0].uuid)
            elif use_uuid and info is not None and info.uuid:
                ids.append(info.uuid)
            else:
                ids.append(str(gpu))
        check_device_ids(gpus, ids, _DEVICE_ID)
        return ids

    def visible_env(self, ids: Sequence[str]) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` and, for containers, ``NVIDIA_VISIBLE_DEVICES``."""
        visible = ",".join(ids)
        return {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}

    def order_env(self) -> dict[str, str]:
        """CUDA numbers devices by PCI bus id, as NVML does."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def no_device_env(self) -> dict[str, str]:
        """Empty (not unset: unset means every GPU), and ``void`` for the container runtime."""
        return {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}

    def cdi_devices(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], naming: CdiNames
    ) -> list[str]:
        """``nvidia.com/gpu=<UUID>``, a MIG GPU's instance by its UUID, else the index.

        ``nvidia-ctk cdi generate`` (``pkg/nvcdi``) names every GPU by its index
        and by its UUID since v1.15 (``--device-name-strategy`` defaults to both),
        and MIG instances by UUID: the UUID names the GPU whatever the bus order.
        """
        del naming  # one naming: both are in NVIDIA's spec
        names: list[str] = []
        for gpu in gpus:
            info = known.get(gpu)
            if info is not None and info.mig_enabled and info.mig_devices:
                names.append(f"{self.cdi_kind}={info.mig_devices[0].uuid}")
            else:
                name = info.uuid if info is not None and info.uuid else str(gpu)
                names.append(f"{self.cdi_kind}={name}")
        return names

    def container_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """UUIDs (CUDA takes them inside a container too), else the container's numbers."""
        ids = self.device_ids(gpus, known, prefer_uuid)
        local = container_indices(gpus)
        return [local[i] if _INDEX.match(entry) else entry for i, entry in enumerate(ids)]

    def container_env(self, ids: Sequence[str]) -> dict[str, str]:
        """CUDA's list; ``NVIDIA_VISIBLE_DEVICES=void``: the engine injected the devices,
        and a legacy runtime hook would read the list with the host's numbers."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids), "NVIDIA_VISIBLE_DEVICES": "void"}

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """A ROCm or CPU-only PyTorch cannot drive NVIDIA GPUs."""
        if build.hip is not None:
            return (
                f"PyTorch {build.version} is a ROCm build (HIP {build.hip}) on an NVIDIA host; "
                "install a CUDA build of PyTorch"
            )
        if build.cuda is None:
            return (
                f"PyTorch {build.version} is a CPU-only build on an NVIDIA host; "
                "install a CUDA build of PyTorch"
            )
        return None

    def amp_problem(self, feature: AmpFeature, torch_version: str) -> str | None:
        """None: every PyTorch with CUDA runs autocast and GradScaler on it."""
        return None

    def health_monitor(self, environ: Mapping[str, str]) -> HealthMonitor | None:
        """NVML's XIDs and error counters, judged between checks."""
        return NvmlHealthMonitor(environ=environ)

    def usage_sampler(
        self, environ: Mapping[str, str], clock: Callable[[], float]
    ) -> UsageSampler | None:
        """NVML's utilization, memory and compute processes."""
        return NvmlUsageSampler(environ, clock)


NVIDIA = Nvidia()
