"""A real podman for the container tests: a busybox image, settings, CDI specs for fake GPUs.

No registry is reachable, so the image is imported from a root file system
built here out of the host's static busybox (``podman import``). Podman reads
its settings from a ``containers.conf`` named by ``CONTAINERS_CONF``: these
machines refuse to raise resource limits, so ``default_ulimits`` is empty. A
CDI spec for the fake GPUs goes under ``/var/run/cdi/`` with a name of the
test's own, and is removed after it.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["CDI_DIR", "Podman", "cdi_spec", "fake_uuid", "podman_or_skip"]

CDI_DIR = Path("/var/run/cdi")
_BUSYBOX = ("/bin/busybox", "/usr/bin/busybox")
_APPLETS = ("sh", "ls", "cat", "env", "sleep", "echo", "hostname", "mkdir", "sort", "id")
_CONF = "[containers]\ndefault_ulimits = []\n"


def fake_uuid(index: int) -> str:
    """The fake NVML's UUID of GPU ``index``."""
    return f"GPU-00000000-0000-4000-8000-{index:012d}"


@dataclass(frozen=True, slots=True)
class Podman:
    """A usable podman: its settings file and the test image's name."""

    conf: Path
    image: str

    @property
    def environ(self) -> dict[str, str]:
        """What podman needs from its environment (the agent passes it on)."""
        return {"CONTAINERS_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> str:
        """``podman ARGS``; its standard output."""
        result = subprocess.run(
            ["podman", *args],
            env={**os.environ, **self.environ},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def containers(self, *filters: str) -> list[dict[str, object]]:
        """``podman ps -a`` as JSON, with ``--filter`` for each of ``filters``."""
        words = [word for f in filters for word in ("--filter", f)]
        return list(json.loads(self.run("ps", "-a", "--format", "json", *words) or "[]"))


def podman_or_skip(workdir: Path) -> Iterator[Podman]:
    """A podman with the test image imported (removed after); skip where there is none."""
    busybox = next((p for p in _BUSYBOX if Path(p).is_file()), None)
    if shutil.which("podman") is None or busybox is None:
        pytest.skip("needs podman and busybox-static (tools/install-test-servers installs them)")
    conf = workdir / "containers.conf"
    conf.write_text(_CONF)
    podman = Podman(conf, f"localhost/allocator-test-busybox:{secrets.token_hex(4)}")
    rootfs = workdir / "rootfs.tar"
    _write_rootfs(rootfs, Path(busybox))
    podman.run("import", str(rootfs), podman.image)
    try:
        yield podman
    finally:
        for found in podman.containers(f"ancestor={podman.image}"):
            podman.run("rm", "-f", str(found["Id"]), check=False)
        podman.run("rmi", "-f", podman.image, check=False)


def _write_rootfs(path: Path, busybox: Path) -> None:
    """A tar of a root file system: busybox, its applets as links, and the usual mount points."""
    with tarfile.open(path, "w") as tar:
        for folder in ("bin", "dev", "proc", "sys", "tmp", "etc", "out"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        tar.add(str(busybox), "bin/busybox")
        for applet in _APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))


@contextmanager
def cdi_spec(indices: Sequence[int]) -> Iterator[Path]:
    """A CDI spec naming each fake GPU ``nvidia.com/gpu=<UUID>``; removed after.

    Each device injects ``ALLOCATOR_TEST_GPU_<i>=<UUID>`` and a device node
    ``/dev/allocator-test-gpu<i>`` (the host's /dev/null): what a container
    sees of its GPUs, checked from inside it.
    """
    devices = [
        {
            "name": fake_uuid(i),
            "containerEdits": {
                "env": [f"ALLOCATOR_TEST_GPU_{i}={fake_uuid(i)}"],
                "deviceNodes": [{"path": f"/dev/allocator-test-gpu{i}", "hostPath": "/dev/null"}],
            },
        }
        for i in indices
    ]
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    path = CDI_DIR / f"allocator-test-{os.getpid()}-{secrets.token_hex(4)}.json"
    # One test's spec at a time: two specs naming the same device conflict.
    with open(CDI_DIR / ".allocator-test.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path.write_text(json.dumps(spec))  # JSON is YAML: podman reads either
        try:
            yield path
        finally:
            with suppress(FileNotFoundError):
                path.unlink()
