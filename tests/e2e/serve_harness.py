"""``allocator serve`` over this test's store, with the example policy applied first."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.e2e.conftest import EXAMPLE_POLICY, Result, clean_env, run_cli
from tests.support.serving import ServeProcess

__all__ = ["Served"]


class Served(ServeProcess):
    """A store with the example policy applied, and ``allocator serve`` reading it."""

    def __init__(
        self,
        store_url: str,
        prefix: str,
        tmp: Path,
        *extra: str,
        policy: Path | None = EXAMPLE_POLICY,
        ready: str = "/api/v1/status",
    ) -> None:
        """``extra``: serve's options; ``policy`` is applied first (``None``: already written)."""
        env = clean_env(ALLOCATOR_STORE=store_url, ALLOCATOR_PREFIX=prefix)
        if policy is not None:
            assert run_cli(["policy", "apply", str(policy)], env).code == 0
        super().__init__(env, tmp / "serve.log", *extra)
        self.wait_until("serve to answer", lambda: self.get(ready)[0] == 200)

    def cli(self, *args: str) -> Result:
        return run_cli(args, self.env)

    @contextmanager
    def waiting_set(self, *words: str) -> Iterator[subprocess.Popen[bytes]]:
        """``allocator set WORDS --wait`` waiting in the queue for the block, killed after it."""
        argv = [sys.executable, "-m", "allocator", "set", *words, "--wait"]
        waiter = subprocess.Popen(
            argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            yield waiter
        finally:
            waiter.kill()
            waiter.wait()

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes, dict[str, str]]:
        self.check_running()
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as response:
                return response.status, response.read(), _lower(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), _lower(exc.headers)
        except OSError:
            return 0, b"", {}


def _lower(headers: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}
