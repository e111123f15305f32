"""A clock tests move by hand, so timing logic is tested without sleeping."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds
