"""A private command server per test: its own runtime directory, store and teardown."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.resident import wire
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[3]
POLICY = REPO / "config" / "policy.example.yaml"


class Resident:
    """The console script's door, run as a user would, with one test's runtime directory."""

    def __init__(self, runtime: Path, store: str, package_dir: Path) -> None:
        self.runtime = runtime
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(package_dir.parent),
            "XDG_RUNTIME_DIR": str(runtime),
            "ALLOCATOR_STORE": store,
            "ALLOCATOR_HOST": "node1",
        }
        path = wire.socket_path(self.env, str(package_dir))
        assert path is not None
        self.socket = Path(path)

    def argv(self, *words: str) -> list[str]:
        return [sys.executable, "-P", "-m", "allocator.resident.door", *words]

    def run(self, *words: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*words),
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(self, *words: str, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*words),
            env={**self.env, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def server_pid(self) -> int | None:
        """The serving server's pid: its socket is there and its lock names it."""
        try:
            if not self.socket.exists():
                return None
            return int(Path(f"{self.socket}.lock").read_text().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def wait_for_server(self) -> int:
        return wait_for("the command server to listen", self.server_pid, timeout=60)

    def stop(self) -> None:
        pid = self.server_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


@pytest.fixture
def resident(tmp_path: Path) -> Iterator[Resident]:
    # A short directory of its own: a socket's path must fit in 107 bytes.
    runtime = Path(tempfile.mkdtemp(prefix="ar-"))
    package_dir = Path(wire.__file__).resolve().parents[1]
    made = Resident(runtime, f"sqlite://{tmp_path / 'store.db'}", package_dir)
    applied = made.run("policy", "apply", str(POLICY), ALLOCATOR_SERVER="0")
    assert applied.returncode == 0, applied.stderr
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(runtime, ignore_errors=True)
