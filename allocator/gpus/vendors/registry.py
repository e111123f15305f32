"""The device layer's vendors: one module each, behind one interface.

:data:`VENDORS` maps a vendor's name (as policies, agent records and
``status`` write it) to its module's :class:`~allocator.gpus.vendors.base.DeviceVendor`.
:func:`read_host_inventory` is what the agent and ``doctor`` call: it finds
which vendor's devices this host has and reads them.

Detection order: the fake-GPU file's ``vendor`` when ``ALLOCATOR_NVML=fake:PATH``;
otherwise NVML (so an NVIDIA host reads exactly as before), then amdsmi, then
Intel cards in sysfs, then Apple silicon. ``ALLOCATOR_NVML=off`` turns
detection off (the policy's declared count stands in).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from allocator.gpus.inventory import Inventory, from_nvml
from allocator.gpus.vendors.amd.vendor import AMD
from allocator.gpus.vendors.apple.vendor import APPLE
from allocator.gpus.vendors.base import (
    VENDOR_NAMES,
    AmpFeature,
    DeviceVendor,
    TorchBuild,
    VendorName,
)
from allocator.gpus.vendors.fake_file import FakeFileError, parse_fake_file
from allocator.gpus.vendors.intel.vendor import INTEL
from allocator.gpus.vendors.nvidia.vendor import NVIDIA

__all__ = [
    "VENDORS",
    "VENDOR_NAMES",
    "VISIBILITY_VARIABLES",
    "AmpFeature",
    "DeviceVendor",
    "TorchBuild",
    "VendorName",
    "amp_problem",
    "fake_file_vendor",
    "read_host_inventory",
    "vendor_named",
]

VENDORS: dict[str, DeviceVendor] = {"nvidia": NVIDIA, "amd": AMD, "intel": INTEL, "apple": APPLE}
#: Every vendor's device filters and orderings, once each: a worker sees only what
#: its own environment names, never the agent's values of these, and a job's ``env``
#: may not set them (a second filter would hide the wrong devices, another order or
#: hierarchy would renumber them).
VISIBILITY_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(v for vendor in VENDORS.values() for v in vendor.visibility_variables)
)


def vendor_named(name: str | None) -> DeviceVendor:
    """The vendor called ``name``; NVIDIA for ``None``/"" (records written before vendors)."""
    if not name:
        return NVIDIA
    try:
        return VENDORS[name]
    except KeyError:
        known = ", ".join(VENDOR_NAMES)
        raise ValueError(f"unknown GPU vendor {name!r} (known: {known})") from None


def amp_problem(device_type: str, feature: AmpFeature, torch_version: str) -> str | None:
    """Why PyTorch ``torch_version`` cannot run ``feature`` on ``device_type`` devices, as
    the vendors whose devices PyTorch drives as that type say (``None``: it can)."""
    drivers = (v for v in VENDORS.values() if v.torch_device_type == device_type)
    return next((p for v in drivers if (p := v.amp_problem(feature, torch_version))), None)


def fake_file_vendor(environ: Mapping[str, str]) -> str | None:
    """The ``vendor`` of the fake-GPU file ``ALLOCATOR_NVML`` names (``None``: no usable file)."""
    mode = environ.get("ALLOCATOR_NVML", "")
    if not mode.startswith("fake:"):
        return None
    path = mode.removeprefix("fake:")
    try:
        return parse_fake_file(Path(path).read_bytes(), path).vendor
    except (OSError, FakeFileError):
        return None  # the NVML path reports the broken file, as it always has


def read_host_inventory(
    declared_gpus: int | None = None, *, environ: Mapping[str, str], vendor: str | None = None
) -> Inventory:
    """This host's devices, of whichever vendor it has; never raises for a missing library.

    ``vendor`` is the policy's for this host: when no library answers (an AMD
    host without amdsmi, detection off), the declared GPUs are that vendor's,
    so its workers get its variables rather than NVIDIA's.
    """
    faked = fake_file_vendor(environ)
    if faked is not None:
        return VENDORS[faked].read_inventory(declared_gpus, environ)
    nvidia = NVIDIA.read_inventory(declared_gpus, environ)
    if from_nvml(nvidia):
        return nvidia
    expected = VENDORS.get(vendor or "nvidia", NVIDIA)
    mode = environ.get("ALLOCATOR_NVML", "")
    if mode == "off":
        return nvidia if expected is NVIDIA else expected.read_inventory(declared_gpus, environ)
    if mode != "on" and mode:  # a broken fake file: NVML's reader reports it
        return nvidia
    unanswered = {"nvidia": nvidia}
    for other in (AMD, INTEL, APPLE):
        found = other.read_inventory(declared_gpus, environ)
        if from_nvml(found) and found.gpus:
            return found
        unanswered[other.name] = found
    # Nothing anywhere: the expected vendor's reason (why its library said nothing).
    return unanswered[expected.name]
