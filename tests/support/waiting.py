"""Polling with a deadline: how tests wait for something, instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 15.0, every: float = 0.02
) -> T:
    """Poll ``probe`` until it returns something truthy and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
