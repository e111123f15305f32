"""AMD GPUs: ``amdsmi`` for inventory and health, ``ROCR_VISIBLE_DEVICES`` for visibility.

``amdsmi`` (AMD's Python interface, installed from the host's ROCm) is imported here
and nowhere else, and only when an AMD host is being read; the fake
(:mod:`allocator.gpus.vendors.amd.fake_amdsmi`) answers with the same function
names from the fake-GPU file when it says ``"vendor": "amd"``.

Visibility: ROCm has three filters that stack. ROCr (the runtime under HIP
and OpenCL) applies ``ROCR_VISIBLE_DEVICES`` first and takes indices or
UUIDs of its own form, ``GPU-`` + the 16 hex digits of the KFD ``unique_id``
(amdsmi's ``asic_serial``; never amdsmi's 36-character device UUID, a token
ROCr refuses, ending its list): see :mod:`~allocator.gpus.vendors.amd.rocr_filter`.
HIP then applies ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``) as
*indices into what ROCr left*. Filtering twice with physical numbers hides
the wrong GPUs, so a worker gets only ``ROCR_VISIBLE_DEVICES``, with UUIDs
(ROCr's device order is not promised to be PCI order; a UUID names one GPU
whatever the order), and the agent never passes its own HIP or CUDA
variables on. PyTorch's ROCm build then numbers the listed GPUs ``cuda:0``,
``cuda:1``... in listed order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from allocator.errors import AllocatorError
from allocator.gpus.health import HealthMonitor
from allocator.gpus.inventory import Inventory, InventorySource, declared_inventory
from allocator.gpus.usage import UsageSampler
from allocator.gpus.vendors.amd.rocr_filter import rocr_uuid, token_problem
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
from allocator.records.gpu_info import GpuInfo

__all__ = ["AMD", "Amd", "AmdSmiUnavailable", "load_amdsmi", "read_amd_gpus", "rocr_uuid_of"]

# An index or a GPU- UUID: nothing ROCr would split or trim.
_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
# amdsmi_status_t AMDSMI_STATUS_NOT_SUPPORTED (include/amd_smi/amdsmi.h); the value,
# not the Python enum's member, whose name differs between amdsmi releases.
_NOT_SUPPORTED = 2
# asic_serial's "not supported" default in amdsmi (ffffffffffffffff).
_UNSUPPORTED_SERIAL = (1 << 64) - 1


class AmdSmiUnavailable(AllocatorError):
    """amdsmi cannot be used here (not installed, no driver, disabled)."""


def load_amdsmi(environ: Mapping[str, str]) -> Any:
    """The amdsmi module, or its fake for ``ALLOCATOR_NVML=fake:PATH``."""
    mode = environ.get("ALLOCATOR_NVML", "")
    if mode.startswith("fake:"):
        from allocator.gpus.vendors.amd.fake_amdsmi import FakeAmdSmi

        return FakeAmdSmi(mode.removeprefix("fake:"))
    if mode == "off":
        raise AmdSmiUnavailable("device libraries disabled (ALLOCATOR_NVML=off)")
    try:
        import amdsmi
    except ImportError as exc:
        raise AmdSmiUnavailable(
            "amdsmi is not installed (it comes with ROCm: pip install /opt/rocm/share/amd_smi)"
        ) from exc
    except Exception as exc:  # its import loads libamd_smi.so, which may be missing
        raise AmdSmiUnavailable(f"amdsmi cannot be loaded: {exc}") from exc
    return amdsmi


@contextmanager
def _session(lib: Any) -> Iterator[Any]:
    try:
        lib.amdsmi_init()
    except lib.AmdSmiException as exc:
        raise AmdSmiUnavailable(f"amdsmi_init failed: {exc}") from exc
    try:
        yield lib
    finally:
        with suppress(lib.AmdSmiException):  # nothing left to release
            lib.amdsmi_shut_down()


def read_amd_gpus(lib: Any) -> tuple[tuple[GpuInfo, ...], str | None]:
    """Every AMD GPU, indexed in PCI order, and the driver version (inside a session)."""
    handles = list(lib.amdsmi_get_processor_handles())
    read = [_read_gpu(lib, handle) for handle in handles]
    read.sort(key=lambda pair: pair[0])
    gpus = tuple(
        GpuInfo(
            index=index,
            uuid=info["uuid"],
            pci_bus_id=bdf,
            name=info["name"],
            memory_total_mib=info["memory"],
            numa_node=info["numa"],
            error=info["error"],
        )
        for index, (bdf, info) in enumerate(read)
    )
    return gpus, _driver_version(lib, handles)


def _read_gpu(lib: Any, handle: Any) -> tuple[str, dict[str, Any]]:
    bdf = str(lib.amdsmi_get_gpu_device_bdf(handle))
    info: dict[str, Any] = {"uuid": None, "name": None, "memory": None, "numa": None, "error": ""}
    try:
        asic = _supported(lib, lib.amdsmi_get_gpu_asic_info, handle) or {}
        info["uuid"] = rocr_uuid_of(asic.get("asic_serial"))
        info["name"] = str(asic.get("market_name") or "AMD GPU")
        vram = _supported(lib, lib.amdsmi_get_gpu_vram_usage, handle)
        info["memory"] = int(vram["vram_total"]) if vram else None
        info["numa"] = _optional(lib, "amdsmi_topo_get_numa_node_number", handle)
        ecc = _supported(lib, lib.amdsmi_get_gpu_total_ecc_count, handle)
        uncorrectable = int(ecc["uncorrectable_count"]) if ecc else 0
        if uncorrectable:
            info["error"] = f"{uncorrectable} uncorrectable ECC errors"
    except lib.AmdSmiException as exc:
        info["error"] = f"amdsmi failed: {exc}"
    return bdf, info


def rocr_uuid_of(asic_serial: object) -> str | None:
    """ROCr's ``GPU-`` token for amdsmi's ``asic_serial`` (``None``: ROCr names it by index).

    amdsmi's binding prints the KFD ``unique_id`` as ``0x`` + 16 hex digits:
    ``N/A`` when the card gave none, all ones when amdsmi could not read it
    (its "not supported" default); neither names a GPU ROCr knows.
    """
    text = str(asic_serial or "").strip()
    try:
        unique_id = int(text, 16)
    except ValueError:  # "N/A"
        return None
    return rocr_uuid(unique_id) if 0 < unique_id < _UNSUPPORTED_SERIAL else None


def _supported(lib: Any, call: Any, handle: Any) -> Any:
    """``call(handle)``, or ``None`` where amdsmi says NOT_SUPPORTED: no signal, not a fault.

    amdsmi answers NOT_SUPPORTED for what the host cannot report (ECC
    without DRM, as on VM guests); NVML's Not Supported is read the same way.
    """
    try:
        return call(handle)
    except lib.AmdSmiException as exc:
        if _error_code(exc) == _NOT_SUPPORTED:
            return None
        raise


def _error_code(exc: BaseException) -> int | None:
    get = getattr(exc, "get_error_code", None)  # AmdSmiLibraryException's; not the base class's
    code = get() if callable(get) else None
    return int(code) if isinstance(code, int) else None


def _optional(lib: Any, name: str, *args: Any) -> Any:
    try:
        return getattr(lib, name)(*args)
    except (lib.AmdSmiException, AttributeError):
        return None


def _driver_version(lib: Any, handles: list[Any]) -> str | None:
    if not handles:
        return None
    info = _optional(lib, "amdsmi_get_gpu_driver_info", handles[0])
    return str(info.get("driver_version")) if isinstance(info, dict) else None


class Amd:
    """AMD's answers to :class:`~allocator.gpus.vendors.base.DeviceVendor`."""

    name: VendorName = "amd"
    display_name = "AMD"
    cdi_kind = "amd.com/gpu"
    torch_device_type = "cuda"  # PyTorch's ROCm build drives HIP devices as "cuda"
    visibility_variables: tuple[str, ...] = (
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "CUDA_VISIBLE_DEVICES",
    )
    # /dev/kfd and /dev/dri/renderD* belong to these (ROCm's install guide adds users
    # to both; which one owns which node differs between distributions).
    device_groups: tuple[str, ...] = ("render", "video")
    health_source: HealthSource = "inventory"
    keeps_indices = False
    cuda_driver_source: str | NotSupported = NotSupported("ROCm GPUs have no CUDA driver")
    docker_gpus = False
    numbers_in_pci_order = False

    def read_inventory(self, declared_gpus: int | None, environ: Mapping[str, str]) -> Inventory:
        """amdsmi's (or the fake's) inventory; the declared count when it fails."""
        try:
            lib = load_amdsmi(environ)
            with _session(lib):
                gpus, driver = read_amd_gpus(lib)
        except AmdSmiUnavailable as exc:
            return _declared(declared_gpus, str(exc))
        except Exception as exc:  # amdsmi's own exception class, or the fake's
            return _declared(declared_gpus, f"amdsmi failed: {exc}")
        faked = environ.get("ALLOCATOR_NVML", "").startswith("fake:")
        source: InventorySource = "fake" if faked else "amdsmi"
        return Inventory(gpus=gpus, source=source, driver_version=driver, vendor="amd")

    def device_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """ROCr's UUIDs whenever every one is known (ROCr's order may differ from PCI order).

        Only a UUID ROCr parses counts (``GPU-`` + 16 hex digits): a longer one,
        such as amdsmi's 36-character UUID in an older agent's record, would
        end ROCr's list and hide every GPU, so indices stand in for it.
        """
        del prefer_uuid  # an index means ROCr's order, which only a UUID pins down
        uuids = [known[gpu].uuid if gpu in known else None for gpu in gpus]
        use_uuid = all(uuid and token_problem(uuid) is None for uuid in uuids)
        ids = [str(uuid) for uuid in uuids] if use_uuid else [str(gpu) for gpu in gpus]
        check_device_ids(gpus, ids, _DEVICE_ID)
        return ids

    def visible_env(self, ids: Sequence[str]) -> dict[str, str]:
        """``ROCR_VISIBLE_DEVICES`` only: HIP's filters would index what ROCr left."""
        return {"ROCR_VISIBLE_DEVICES": ",".join(ids)}

    def order_env(self) -> dict[str, str]:
        """Nothing: its runtime numbers devices as its inventory does."""
        return {}

    def no_device_env(self) -> dict[str, str]:
        """``-1`` is no device's index or UUID: ROCr exposes nothing."""
        return {"ROCR_VISIBLE_DEVICES": "-1"}

    def cdi_devices(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], naming: CdiNames
    ) -> list[str]:
        """``amd.com/gpu=<index>``: ROCm's container toolkit (``internal/cdi/cdi.go``)
        names the GPUs ``0``...``n-1`` (and ``all``) in the order of the driver's PCI
        devices, which is the inventory's PCI order."""
        del known, naming
        return [f"{self.cdi_kind}={gpu}" for gpu in gpus]

    def container_ids(
        self, gpus: Sequence[int], known: Mapping[int, GpuInfo], prefer_uuid: bool
    ) -> list[str]:
        """ROCr's UUIDs (the same inside a container), else the container's numbers."""
        ids = self.device_ids(gpus, known, prefer_uuid)
        local = container_indices(gpus)
        return [local[i] if entry.isdigit() else entry for i, entry in enumerate(ids)]

    def container_env(self, ids: Sequence[str]) -> dict[str, str]:
        """As on the host: ``ROCR_VISIBLE_DEVICES`` only."""
        return self.visible_env(ids)

    def torch_build_problem(self, build: TorchBuild) -> str | None:
        """A CUDA or CPU-only PyTorch cannot drive AMD GPUs."""
        if build.hip is not None:
            return None
        kind = f"a CUDA build (CUDA {build.cuda})" if build.cuda else "a CPU-only build"
        return (
            f"PyTorch {build.version} is {kind} on an AMD host; install PyTorch's ROCm "
            "build (https://pytorch.org/get-started/locally/)"
        )

    def amp_problem(self, feature: AmpFeature, torch_version: str) -> str | None:
        """None: every PyTorch ROCm build runs autocast and GradScaler on it."""
        return None

    def health_monitor(self, environ: Mapping[str, str]) -> HealthMonitor | None:
        """None: amdsmi reports no health signals between reads; a fresh inventory
        read's unreadable GPUs are its health (``health_source`` ``inventory``)."""
        return None

    def usage_sampler(
        self, environ: Mapping[str, str], clock: Callable[[], float]
    ) -> UsageSampler | None:
        """None: no usage is read from amdsmi (an unmeasured GPU is never taken for idle)."""
        return None


def _declared(declared_gpus: int | None, reason: str) -> Inventory:
    inventory = declared_inventory(declared_gpus, reason)
    return Inventory(inventory.gpus, inventory.source, error=inventory.error, vendor="amd")


AMD = Amd()
