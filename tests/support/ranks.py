"""What the ranks of a job across two hosts wrote (``tests/support/gloo_worker.py``), checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_for

__all__ = ["rank_reports", "two_host_all_reduce"]


def rank_reports(ranks: Path, world: int) -> list[dict[str, Any]] | None:
    """Every rank's report in ``ranks``, by rank; ``None`` until all ``world`` are there."""
    paths = [ranks / f"rank{rank}.json" for rank in range(world)]
    if not all(path.exists() for path in paths):
        return None
    return [json.loads(path.read_text()) for path in paths]


def two_host_all_reduce(ranks: Path, what: str, timeout: float) -> list[dict[str, str]]:
    """Wait for the four ranks of node1 and node2 (two each) to all-reduce; their environments.

    Every rank took part in one group of four, and the ranks were placed in
    order: node1's two first, then node2's.
    """
    reports = wait_for(what, lambda: rank_reports(ranks, 4), timeout)
    assert [r["sum"] for r in reports] == [10.0] * 4  # 1 + 2 + 3 + 4: every rank took part
    assert {r["world"] for r in reports} == {4}
    envs: list[dict[str, str]] = [r["env"] for r in reports]
    assert [(e["ALLOCATOR_HOST"], e["GROUP_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("node1", "0", "0"),
        ("node1", "0", "1"),
        ("node2", "1", "0"),
        ("node2", "1", "1"),
    ]
    return envs
