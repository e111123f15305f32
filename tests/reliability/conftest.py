"""The reliability suite: production faults, small in `make test`, long in `make soak`.

Each test sizes itself with :func:`scale` (``scale(3, 20)``: 3 cycles in
``make test``, 20 under ``make soak``) and records what it measured with the
``figures`` fixture; ``make soak`` prints every figure at the end of the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: Set by ``make soak``: run every reliability test at its long size.
SOAK = os.environ.get("ALLOCATOR_SOAK") == "1"

_FIGURES: list[str] = []


def scale(small: int, soak: int) -> int:
    """``small`` in ``make test``, ``soak`` under ``make soak``."""
    return soak if SOAK else small


class Figures:
    """What one test measured, printed in the run's summary."""

    def __init__(self, test: str) -> None:
        self.test = test

    def add(self, name: str, value: object) -> None:
        """Record ``name = value`` for the summary."""
        _FIGURES.append(f"{self.test}: {name} = {value}")


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """Record figures (cycles run, worst convergence, ...) for the run's summary."""
    yield Figures(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every recorded figure (the numbers `make soak` reports)."""
    if _FIGURES:
        terminalreporter.section(f"reliability figures ({'soak' if SOAK else 'small'})")
        for line in _FIGURES:
            terminalreporter.write_line(line)
