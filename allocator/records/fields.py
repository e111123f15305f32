"""The constrained field types of stored records (names, indices, texts, times).

A type here carries its bound (``msgspec.Meta``), so every record that uses
it is checked the same way when it is decoded.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "MAX_GPU_INDEX",
    "MAX_SLOTS",
    "PCIE_LEVELS",
    "SCHEMA_VERSION",
    "Address",
    "Argument",
    "Count",
    "CpuList",
    "DeviceUuid",
    "GpuIndex",
    "Name",
    "Nodes",
    "PcieLevel",
    "Port",
    "Rfc3339",
    "Sha256",
    "Slots",
    "Text",
]

SCHEMA_VERSION = 1
#: The highest GPU index anything accepts (the CLI, the policy, stored records).
MAX_GPU_INDEX = 1023

# \Z, not $: "$" also matches before a trailing newline, and "train\n" is no job name.
_NAME = r"^(?!-)(?!\.\.?\Z)[A-Za-z0-9._-]{1,63}\Z"
Name = Annotated[str, msgspec.Meta(pattern=_NAME)]
GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_INDEX)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Text = Annotated[str, msgspec.Meta(max_length=4096)]
# A device id that goes into CUDA_VISIBLE_DEVICES: no comma, no space, nothing CUDA stops at.
DeviceUuid = Annotated[str, msgspec.Meta(pattern=r"^(GPU|MIG)-[A-Za-z0-9/._-]{1,120}\Z")]
Argument = Annotated[str, msgspec.Meta(max_length=65536)]
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
#: A host name or IP address another host can reach (no scheme, no port, no space).
Address = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:%-]{0,252}\Z")]
#: The hosts of one job across several hosts, in node-rank order (at most a store
#: transaction's worth: see allocator.control.across_hosts).
Nodes = Annotated[tuple[Name, ...], msgspec.Meta(max_length=64)]
#: The most jobs one GPU of a shared pool may hold at once (what ``slots`` may say).
MAX_SLOTS = 256
Slots = Annotated[int, msgspec.Meta(ge=1, le=MAX_SLOTS)]
#: A Linux CPU list (``0-27,56-83``), as in ``/sys/devices/system/node/node0/cpulist``.
CpuList = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[0-9]{1,6}(-[0-9]{1,6})?(,[0-9]{1,6}(-[0-9]{1,6})?)*\Z", max_length=16384
    ),
]
#: How two GPUs are connected below NVLink, best first: NVML's topology levels
#: (nvmlDeviceGetTopologyCommonAncestor: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE,
#: NODE, SYSTEM); ``nvidia-smi topo -m`` calls the middle ones PIX, PXB, PHB, NODE, SYS.
PcieLevel = Literal["board", "switch", "switches", "host-bridge", "node", "system"]
PCIE_LEVELS: tuple[PcieLevel, ...] = (
    "board",
    "switch",
    "switches",
    "host-bridge",
    "node",
    "system",
)
#: An RFC 3339 time with its zone, as :func:`allocator.util.times.format_time` writes it.
Rfc3339 = Annotated[
    str,
    msgspec.Meta(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)\Z"),
]
