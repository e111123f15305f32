"""Helpers to write fake-NVML JSON files (``ALLOCATOR_NVML=fake:PATH``) in tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FakeGpus", "fake_device", "fake_environ", "real_nvml_or_skip", "write_fake_nvml"]


def fake_device(index: int, **fields: Any) -> dict[str, Any]:
    """One device entry: ``index`` plus whatever fields the test sets."""
    return {"index": index, **fields}


def write_fake_nvml(path: Path, devices: int | list[dict[str, Any]], **system: Any) -> Path:
    """Write a fake-NVML file with ``devices`` (a count, or entries) and top-level fields."""
    entries = [fake_device(i) for i in range(devices)] if isinstance(devices, int) else devices
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"devices": entries, **system}))
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path


def fake_environ(path: Path, **extra: str) -> dict[str, str]:
    """A minimal environment pointing NVML at the fake file ``path``."""
    return {"ALLOCATOR_NVML": f"fake:{path}", "PATH": os.environ.get("PATH", ""), **extra}


class FakeGpus:
    """A fake-NVML file a test edits between health checks."""

    def __init__(self, path: Path, count: int, **system: Any) -> None:
        """Create ``count`` healthy fake GPUs at ``path``."""
        self.path = path
        self.system = system
        self.devices = [fake_device(i) for i in range(count)]
        self.save()

    @property
    def environ(self) -> dict[str, str]:
        """An environment selecting this fake."""
        return fake_environ(self.path)

    def save(self) -> None:
        """Write the current devices to the file."""
        write_fake_nvml(self.path, self.devices, **self.system)

    def update(self, index: int, **fields: Any) -> None:
        """Change fields of GPU ``index`` (``None`` removes a field) and save."""
        device = self.devices[index]
        for key, value in fields.items():
            if value is None:
                device.pop(key, None)
            else:
                device[key] = value
        self.save()

    def add_xid(self, index: int, xid: int) -> None:
        """Append an XID event to GPU ``index``'s log and save."""
        self.devices[index].setdefault("xid_events", []).append(xid)
        self.save()


def real_nvml_or_skip() -> Any:
    """The real inventory for ``gpu``-marked tests; skips where NVML finds no GPU."""
    from allocator.gpus.vendors.nvidia.vendor import read_inventory

    env = {k: v for k, v in os.environ.items() if k != "ALLOCATOR_NVML"}
    inventory = read_inventory(environ=env)
    if inventory.source != "nvml" or not inventory.gpus:
        pytest.skip(f"needs a real NVIDIA GPU with NVML: {inventory.error or 'no GPUs'}")
    return inventory
