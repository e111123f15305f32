"""count=N on big hosts: the work grows with the host's size, not with its square or cube.

Work is counted, not timed: every Python and builtin function call during
``place()``, under ``sys.setprofile``. A generator step counts as a call, so
a rescan of every candidate per added GPU shows up as it would in time.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from allocator.placement.choose import Request, place
from allocator.policy.model import Host, Policy
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def big_host(gpus: int) -> tuple[Policy, list[GpuInfo]]:
    """A host of ``gpus`` GPUs on 4 NUMA nodes, NVLinked in groups of 8."""
    inventory = [
        GpuInfo(
            index=i,
            numa_node=i * 4 // gpus,
            nvlink_peers=tuple(p for p in range(i - i % 8, i - i % 8 + 8) if p != i),
        )
        for i in range(gpus)
    ]
    return Policy(version=1, hosts={"big": Host("big", gpus)}), inventory


def calls_to_place(gpus: int, count: int, held: dict[str, Assignment] | None = None) -> int:
    """Function calls ``place()`` makes for ``count=`` on a host of ``gpus`` GPUs."""
    policy, inventory = big_host(gpus)
    calls = 0

    def profiler(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    request = Request(job="train", host="big", count=count)
    sys.setprofile(profiler)
    try:
        place(policy, request, held or {}, NOW, inventory=inventory)
    finally:
        sys.setprofile(None)
    return calls


def test_count_n_work_grows_about_linearly_with_the_host() -> None:
    small, large = calls_to_place(64, 32), calls_to_place(256, 128)
    # 4 times the GPUs: n log n is ~5 times the work; the old greedy search,
    # which rescanned every candidate per GPU added, did 60 times more.
    assert large < 8 * small, (small, large)


def test_half_of_a_1024_gpu_host_fits_on_two_numa_nodes() -> None:
    policy, inventory = big_host(1024)
    busy = Assignment(
        job="other", host="big", gpus=(0,), mode="gpu", updated_by="x", updated_at="t"
    )
    placement = place(
        policy, Request(job="train", host="big", count=512), {"other": busy}, NOW, inventory
    )
    chosen: Sequence[int] = placement.gpus
    assert len(chosen) == 512 and 0 not in chosen
    assert len({gpu * 4 // 1024 for gpu in chosen}) == 2  # 256 GPUs per node


def test_every_gpu_of_a_1024_gpu_host_can_be_asked_for() -> None:
    policy, inventory = big_host(1024)
    placement = place(policy, Request(job="train", host="big", count=1024), {}, NOW, inventory)
    assert placement.gpus == tuple(range(1024))
