"""``allocator serve`` as a real process on a free loopback port, for the tests and the bench."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.support.etcd_server import free_port
from tests.support.waiting import wait_for

__all__ = ["ServeProcess"]

T = TypeVar("T")


class ServeProcess:
    """``allocator serve --listen 127.0.0.1:PORT EXTRA`` run with ``env``, its output in ``log``."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        *extra: str,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.env = env
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.log = log.open("wb")
        argv = [sys.executable, "-m", "allocator", "serve", "--listen", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(
            [*argv, *extra],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )

    def check_running(self) -> None:
        """Fail if the server has exited (a request would only time out)."""
        if self.process.poll() is not None:
            raise AssertionError(f"allocator serve exited with {self.process.returncode}")

    def wait_until(
        self, what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.02
    ) -> T:
        """Poll ``probe`` until it is truthy, failing at once if the server exits."""

        def alive_probe() -> T | None:
            self.check_running()
            return probe()

        return wait_for(what, alive_probe, timeout, every)

    def close(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and close its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
