"""CDI specs for fake GPUs in the shape each vendor's own generator writes, and fake nodes.

Each generator writes the devices, names and device nodes its vendor's tool
would, with every node's host path a character device made here (the host's
null device, numbers 1:3) under a test folder, owned as the real node is: so
a container given a device by its vendor's name gets exactly that vendor's
nodes, and a job user opens them only through the node's group.

* :func:`nvidia_spec`: nvidia-container-toolkit ``pkg/nvcdi`` (``nvidia-ctk cdi
  generate``): kind ``nvidia.com/gpu``, each GPU named by its index and by its
  UUID (the default ``--device-name-strategy`` since v1.15), plus ``all``;
  ``/dev/nvidia<N>`` world-readable; ``NVIDIA_VISIBLE_DEVICES=void`` in the
  spec's own edits, so a legacy hook injects nothing more.
* :func:`amd_spec`: ROCm/container-toolkit ``internal/cdi/cdi.go``: kind
  ``amd.com/gpu``, devices ``0``..``n-1`` in the order of the
  driver's PCI devices, plus ``all``; each with ``/dev/dri/card<N>``,
  ``/dev/dri/renderD<128+N>`` and the shared ``/dev/kfd``, with the host node's
  GID and mode recorded (``internal/amdgpu/amdgpu.go`` stats them).
* :func:`intel_spec`: intel-resource-drivers-for-kubernetes
  ``pkg/gpu/cdihelpers`` (``addDRMEdits``): kind ``intel.com/gpu``, each GPU's
  ``/dev/dri/card<N>`` and ``/dev/dri/renderD<128+N>`` (type ``c``, nothing
  else: the engine takes the rest from the host node), named ``card<N>`` (as
  intel-device-plugins' generator names them) or by the DRA driver's
  PCI-based id (``DeviceUIDFromPCIinfo``: ``0000-03-00-0-0x56c0``).

Every spec says cdiVersion 0.5.0: AMD's generator writes 0.6.0, which the CDI
library of podman 4.3 (the tested engine) does not resolve; the fields used
are the same in both.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import secrets
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tests.support.podman import CDI_DIR

__all__ = ["FakeNodes", "amd_spec", "installed_spec", "intel_spec", "nvidia_spec"]

_NULL = os.makedev(1, 3)


class FakeNodes:
    """Character devices under ``folder`` standing in for a host's GPU nodes."""

    def __init__(self, folder: Path) -> None:
        """Make nodes under ``folder`` (created)."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def node(self, name: str, mode: int, group: str | None) -> dict[str, Any]:
        """A node ``name`` with ``mode``, group ``group`` (root's when None): its stat."""
        path = self.folder / name
        if not path.exists():
            os.mknod(path, stat.S_IFCHR | mode, _NULL)
        gid = grp.getgrnam(group).gr_gid if group is not None else 0
        os.chown(path, 0, gid)
        os.chmod(path, mode)  # mknod's mode is cut by the umask
        return {"hostPath": str(path), "gid": gid, "mode": mode}


def nvidia_spec(uuids: Sequence[str], nodes: FakeNodes) -> dict[str, Any]:
    """nvidia-ctk's spec: each GPU by index and by UUID, then ``all``."""
    devices: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    for index, uuid in enumerate(uuids):
        found = nodes.node(f"nvidia{index}", 0o666, None)
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{index}", "hostPath": found["hostPath"]}]}
        devices += [{"name": str(index), "containerEdits": edits}]
        devices += [{"name": uuid, "containerEdits": edits}]
        every += edits["deviceNodes"]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every}})
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }


def amd_spec(count: int, nodes: FakeNodes) -> dict[str, Any]:
    """ROCm's container toolkit's spec: ``0``..``count-1`` and ``all``."""
    kfd = _amd_node(nodes, "kfd", "render")
    devices: list[dict[str, Any]] = []
    for index in range(count):
        own = [
            _amd_node(nodes, f"dri/card{index}", "video"),
            _amd_node(nodes, f"dri/renderD{128 + index}", "render"),
        ]
        devices.append({"name": str(index), "containerEdits": {"deviceNodes": [*own, kfd]}})
    every = [n for d in devices for n in d["containerEdits"]["deviceNodes"] if n is not kfd]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [*every, kfd]}})
    return {"cdiVersion": "0.5.0", "kind": "amd.com/gpu", "devices": devices}


def _amd_node(nodes: FakeNodes, name: str, group: str) -> dict[str, Any]:
    (nodes.folder / name).parent.mkdir(parents=True, exist_ok=True)
    found = nodes.node(name, 0o660, group)
    return {
        "path": f"/dev/{name}",
        "hostPath": found["hostPath"],
        "type": "c",
        "major": 1,
        "minor": 3,
        "fileMode": found["mode"],
        "permissions": "rwm",
        "uid": 0,
        "gid": found["gid"],
    }


def intel_spec(
    cards: Mapping[int, tuple[str, str]], nodes: FakeNodes, naming: str = "card"
) -> dict[str, Any]:
    """Intel's spec for ``cards``: card number -> (PCI address, PCI device id)."""
    devices: list[dict[str, Any]] = []
    for card, (address, device_id) in sorted(cards.items()):
        (nodes.folder / "dri").mkdir(parents=True, exist_ok=True)
        edits = [
            {
                "path": f"/dev/dri/{name}",
                "hostPath": nodes.node(f"dri/{name}", 0o660, group)["hostPath"],
                "type": "c",
            }
            for name, group in ((f"card{card}", "video"), (f"renderD{128 + card}", "render"))
        ]
        uid = f"{address.replace(':', '-').replace('.', '-')}-{device_id}"
        name = f"card{card}" if naming == "card" else uid
        devices.append({"name": name, "containerEdits": {"deviceNodes": edits}})
    return {"cdiVersion": "0.5.0", "kind": "intel.com/gpu", "devices": devices}


@contextmanager
def installed_spec(spec: Mapping[str, Any]) -> Iterator[Path]:
    """``spec`` under /var/run/cdi for the block (one test's at a time; removed after)."""
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    path = CDI_DIR / f"allocator-test-{os.getpid()}-{secrets.token_hex(4)}.json"
    # Two specs naming the same device conflict: the same lock as tests.support.podman's.
    with open(CDI_DIR / ".allocator-test.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path.write_text(json.dumps(spec))
        try:
            yield path
        finally:
            with suppress(FileNotFoundError):
                path.unlink()
