"""Placement on shared GPUs (slots, exclusive jobs, MPS) and by links (NVLink, PCIe, NUMA)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.errors import PlacementRefused, RequestError
from allocator.placement.choose import Request, gpu_blockers, place
from allocator.policy.model import Host, Job, Policy, Pool, Sharing, WorkerMode
from allocator.policy.sharing_field import SHARED
from allocator.records.fields import PcieLevel
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SLICED = Sharing("time-slice", 4)
MPS = Sharing("mps", 2)


def make_policy(sharing: Sharing, workers: WorkerMode = "per-gpu") -> Policy:
    """node1 (4 GPUs) in pool 'p'; 'train' as asked, 'solo' exclusive, 'one' single-worker."""
    return Policy(
        version=1,
        hosts={"node1": Host("node1", 4, pool="p")},
        pools={"p": Pool("p", ("node1",), sharing=sharing)},
        jobs={
            "train": Job("train", ("python",), workers=workers),
            "solo": Job("solo", ("python",), exclusive=True),
            "one": Job("one", ("python",)),
        },
    )


def held(job: str, *gpus: int, slots: int = 1, exclusive: bool = False) -> Assignment:
    return Assignment(
        job=job,
        host="node1",
        gpus=gpus,
        mode="gpu",
        updated_by="alice",
        updated_at="2026-05-31T10:00:00Z",
        slots=slots,
        exclusive=exclusive,
    )


def on(*assignments: Assignment) -> dict[str, Assignment]:
    return {a.job: a for a in assignments}


def count(n: int, job: str = "train", **extra: object) -> Request:
    return Request(job=job, host="node1", count=n, **extra)  # type: ignore[arg-type]


def explicit(*gpus: int, job: str = "train", **extra: object) -> Request:
    return Request(job=job, host="node1", gpus=gpus, **extra)  # type: ignore[arg-type]


def topology(
    levels: Mapping[tuple[int, int], PcieLevel],
    size: int = 4,
    numa: Sequence[int] | None = None,
    links: Mapping[int, tuple[int, ...]] | None = None,
) -> tuple[GpuInfo, ...]:
    """GPUs whose pairwise PCIe levels are ``levels`` (both ways; unnamed pairs: system)."""
    table: list[list[PcieLevel | None]] = [
        [None if i == j else "system" for j in range(size)] for i in range(size)
    ]
    for (a, b), level in levels.items():
        table[a][b] = table[b][a] = level
    return tuple(
        GpuInfo(
            index=i,
            numa_node=numa[i] if numa is not None else None,
            nvlink_peers=(links or {}).get(i, ()),
            pcie_levels=tuple(table[i]),
        )
        for i in range(size)
    )


# --- slots ----------------------------------------------------------------------------


def test_a_gpu_takes_jobs_until_its_slots_are_full() -> None:
    policy = make_policy(SLICED)
    current = on(held("a", 0, slots=2), held("b", 0))
    assert place(policy, explicit(0), current, NOW).gpus == (0,)
    with pytest.raises(PlacementRefused) as refused:
        place(policy, explicit(0, slots=2), current, NOW)
    assert "3 of 4 slots in use, 2 asked" in str(refused.value)


def test_a_shared_placement_notes_the_slots_in_use_with_the_job() -> None:
    result = place(make_policy(SLICED), explicit(0, slots=2), on(held("a", 0)), NOW)
    assert result.slots == 2
    assert result.notes == (
        "GPU 0 on node1 is shared with job 'a' (since 2026-05-31T10:00:00Z, by alice) "
        "(3/4 slots in use with this job)",
    )


def test_count_skips_full_gpus_and_names_who_fills_them() -> None:
    policy = make_policy(Sharing("time-slice", 2))
    current = on(held("a", 0, 1, slots=2), held("b", 2))
    assert place(policy, count(2), current, NOW).gpus == (2, 3)
    blockers = gpu_blockers(policy, "node1", "train", current, NOW)
    assert blockers[0] == "held by job 'a': 2 of 2 slots in use, 1 asked"
    assert 2 not in blockers


def test_slots_are_refused_where_gpus_are_whole_or_too_few() -> None:
    with pytest.raises(RequestError, match="slots= is for shared pools"):
        place(make_policy(Sharing()), explicit(0, slots=2), {}, NOW)
    with pytest.raises(RequestError, match="has 4 per GPU"):
        place(make_policy(SLICED), explicit(0, slots=5), {}, NOW)
    with pytest.raises(RequestError, match="slots= is for GPUs"):
        Request(job="train", host="node1", cpu=True, slots=1)


def test_the_old_shared_pool_has_no_slot_limit() -> None:
    crowd = on(*(held(f"j{n}", 0, slots=50) for n in range(10)))
    assert place(make_policy(SHARED), explicit(0, slots=100), crowd, NOW).gpus == (0,)


# --- exclusive jobs ---------------------------------------------------------------------


def test_an_exclusive_job_is_never_placed_on_a_shared_slot() -> None:
    policy = make_policy(SLICED)
    with pytest.raises(PlacementRefused, match="job 'solo' takes GPUs whole"):
        place(policy, explicit(0, job="solo"), on(held("a", 0)), NOW)
    result = place(policy, count(1, job="solo"), on(held("a", 0)), NOW)
    assert (result.gpus, result.exclusive) == ((1,), True)


def test_no_job_joins_an_exclusive_job() -> None:
    current = on(held("solo", 0, exclusive=True))
    with pytest.raises(PlacementRefused, match="which takes GPUs whole"):
        place(make_policy(SLICED), explicit(0), current, NOW)
    assert place(make_policy(SLICED), count(3), current, NOW).gpus == (1, 2, 3)


def test_an_exclusive_job_asks_for_no_slots() -> None:
    with pytest.raises(RequestError, match="exclusive: true"):
        place(make_policy(SLICED), explicit(0, job="solo", slots=2), {}, NOW)


# --- MPS --------------------------------------------------------------------------------


def test_under_mps_a_single_worker_job_asks_for_one_gpu() -> None:
    with pytest.raises(RequestError, match="under MPS a worker uses one GPU"):
        place(make_policy(MPS), count(2, job="one"), {}, NOW)
    assert place(make_policy(MPS), count(2), {}, NOW).gpus == (0, 1)  # per-gpu: fine
    assert place(make_policy(MPS), explicit(0, 1, job="solo"), {}, NOW).exclusive


# --- count=N in a shared pool: free capacity first, unless prefer=links --------------------


def test_a_free_pair_comes_before_half_of_a_busy_nvlink_pair() -> None:
    gpus = topology({}, links={0: (1,), 1: (0,)})
    busy = on(held("a", 0))
    free_first = place(make_policy(SLICED), count(2), busy, NOW, inventory=gpus)
    assert free_first.gpus == (1, 2)  # no other job on either
    assert free_first.picked == "across CPU sockets; no other job on them"
    links_first = place(make_policy(SLICED), count(2, prefer="links"), busy, NOW, inventory=gpus)
    assert links_first.gpus == (0, 1)
    assert links_first.picked == "NVLink pair; 1 slot(s) shared"


# --- links below NVLink -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("better", "worse"),
    [
        ("switch", "host-bridge"),
        ("board", "switch"),
        ("switches", "host-bridge"),
        ("host-bridge", "node"),
        ("node", "system"),
    ],
)
def test_count_picks_the_pair_with_the_closer_pcie_link(
    better: PcieLevel, worse: PcieLevel
) -> None:
    gpus = topology({(0, 1): worse, (2, 3): better, (0, 2): "system", (1, 3): "system"})
    result = place(make_policy(Sharing()), count(2), {}, NOW, inventory=gpus)
    assert result.gpus == (2, 3)


def test_nvlink_outranks_every_pcie_level() -> None:
    gpus = topology({(2, 3): "board"}, links={0: (1,), 1: (0,)})
    result = place(make_policy(Sharing()), count(2), {}, NOW, inventory=gpus)
    assert (result.gpus, result.picked) == ((0, 1), "NVLink pair")


def test_a_four_gpu_set_stays_under_one_host_bridge_before_one_numa_node() -> None:
    # 8 GPUs on one NUMA node: two host bridges (0-3, 4-7), each with two switches.
    levels: dict[tuple[int, int], PcieLevel] = {}
    for a in range(8):
        for b in range(a + 1, 8):
            same_bridge = a // 4 == b // 4
            levels[a, b] = (
                ("switch" if a // 2 == b // 2 else "host-bridge") if same_bridge else "node"
            )
    gpus = topology(levels, size=8, numa=[0] * 8)
    result = place(make_policy(Sharing()), count(4), on(held("x", 1)), NOW, inventory=gpus)
    assert (result.gpus, result.picked) == ((4, 5, 6, 7), "same PCIe host bridge")
    pair = place(make_policy(Sharing()), count(2), on(held("x", 0)), NOW, inventory=gpus)
    assert (pair.gpus, pair.picked) == ((2, 3), "same PCIe switch")


def test_the_numa_node_is_named_when_it_is_the_closest_link() -> None:
    gpus = topology({(0, 1): "node", (2, 3): "node"}, numa=[0, 0, 1, 1])
    result = place(make_policy(Sharing()), count(2), on(held("x", 0)), NOW, inventory=gpus)
    assert (result.gpus, result.picked) == ((2, 3), "same NUMA node 1")


def test_an_explicit_list_across_sockets_is_honoured_with_a_note() -> None:
    gpus = topology({}, numa=[0, 0, 1, 1])
    result = place(make_policy(Sharing()), explicit(1, 2), {}, NOW, inventory=gpus)
    assert result.gpus == (1, 2)
    assert result.notes == (
        "GPUs 1,2 on node1 span NUMA nodes 0, 1: traffic between them crosses the CPU "
        "interconnect (count= would keep them on one node where it can)",
    )
    assert place(make_policy(Sharing()), explicit(0, 1), {}, NOW, inventory=gpus).notes == ()


def test_a_big_host_with_pcie_levels_is_grown_greedily_under_one_bridge() -> None:
    # 24 GPUs, 3 host bridges of 8 under 1 NUMA node: C(24, 8) sets is past the exhaustive limit.
    levels = {
        (a, b): ("host-bridge" if a // 8 == b // 8 else "node")
        for a in range(24)
        for b in range(a + 1, 24)
    }
    gpus = topology(levels, size=24, numa=[0] * 24)  # type: ignore[arg-type]
    policy = Policy(version=1, hosts={"big": Host("big", 24)})
    request = Request(job="train", host="big", count=8)
    result = place(policy, request, {"x": held("x", 0)}, NOW, inventory=gpus)
    assert result.gpus == tuple(range(8, 16))


# --- property: a shared GPU is never overfilled ------------------------------------------


@st.composite
def holdings(draw: st.DrawFn) -> dict[str, Assignment]:
    jobs = draw(st.lists(st.sampled_from(["a", "b", "c", "solo"]), unique=True, max_size=4))
    return {
        job: held(
            job,
            *sorted(draw(st.sets(st.integers(0, 3), min_size=1, max_size=3))),
            slots=1 if job == "solo" else draw(st.integers(1, 3)),
            exclusive=job == "solo",
        )
        for job in jobs
    }


@settings(max_examples=300, deadline=None)
@given(
    current=holdings(),
    capacity=st.integers(1, 4),
    job=st.sampled_from(["train", "solo", "a"]),
    asked=st.integers(1, 4),
    slots=st.none() | st.integers(1, 3),
    prefer=st.sampled_from(["free", "links"]),
)
def test_no_placement_overfills_a_gpu_or_shares_an_exclusive_one(
    current: dict[str, Assignment],
    capacity: int,
    job: str,
    asked: int,
    slots: int | None,
    prefer: str,
) -> None:
    policy = make_policy(Sharing("time-slice", capacity))
    request = Request(job=job, host="node1", count=asked, slots=slots, prefer=prefer)  # type: ignore[arg-type]
    try:
        result = place(policy, request, current, NOW)
    except (PlacementRefused, RequestError):
        return
    after = {
        **current,
        job: held(job, *result.gpus, slots=result.slots, exclusive=result.exclusive),
    }
    for gpu in result.gpus:
        holds = [a for a in after.values() if gpu in a.gpus]
        if any(a.exclusive for a in holds):
            assert len(holds) == 1
        assert sum(a.slots for a in holds) <= capacity
