"""Placement decisions: legality of explicit requests, choice for count=N, fallback."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.errors import EXIT_CONFLICT, EXIT_INVALID, PlacementRefused, RequestError
from allocator.placement.choose import (
    Placement,
    Request,
    gpu_blockers,
    gpu_holders,
    host_gpu_indices,
    place,
)
from allocator.policy.model import (
    FallbackAction,
    FallbackRule,
    Host,
    Job,
    Policy,
    Pool,
    Reservation,
    Sharing,
)
from allocator.policy.sharing_field import SHARED
from allocator.records.gpu_info import GpuInfo
from allocator.records.types import Assignment

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
EXCLUSIVE = Sharing()
NEW_YEAR = datetime(2027, 1, 1, tzinfo=UTC)

NIGHTLY = Reservation(
    name="nightly-eval", host="node1", gpus=(3,), for_jobs=("eval-*",), until=NEW_YEAR
)


def make_policy(
    *,
    sharing: Sharing = EXCLUSIVE,
    max_gpus: int | None = None,
    reservations: tuple[Reservation, ...] = (),
    fallback_action: FallbackAction | None = None,
) -> Policy:
    """node1 (4 GPUs) and node2 (8 GPUs) in pool 'a100'; job 'train' may have a fallback."""
    rule = "on-cpu" if fallback_action is not None else None
    return Policy(
        version=1,
        hosts={"node1": Host("node1", 4, pool="a100"), "node2": Host("node2", 8, pool="a100")},
        pools={
            "a100": Pool("a100", ("node1", "node2"), sharing=sharing, max_gpus_per_job=max_gpus)
        },
        reservations=reservations,
        jobs={"train": Job("train", ("python", "train.py"), fallback=rule)},
        fallback={"on-cpu": FallbackRule("on-cpu", fallback_action, threads=8)}
        if fallback_action is not None
        else {},
    )


def held(job: str, *gpus: int, mode: str = "gpu") -> Assignment:
    """An assignment of ``gpus`` to ``job`` on node1 written by alice."""
    return Assignment(
        job=job,
        host="node1",
        gpus=gpus,
        mode="cpu" if mode == "cpu" else "gpu",
        updated_by="alice",
        updated_at="2026-05-31T10:00:00Z",
    )


def on(*assignments: Assignment) -> dict[str, Assignment]:
    return {a.job: a for a in assignments}


def inventory(
    count: int,
    numa: Sequence[int | None] | None = None,
    links: Mapping[int, tuple[int, ...]] | None = None,
) -> tuple[GpuInfo, ...]:
    return tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-{i:04d}",
            numa_node=numa[i] if numa is not None else None,
            nvlink_peers=(links or {}).get(i, ()),
        )
        for i in range(count)
    )


def explicit(*gpus: int, job: str = "train", host: str = "node1") -> Request:
    return Request(job=job, host=host, gpus=gpus)


def count(n: int, job: str = "train", host: str = "node1") -> Request:
    return Request(job=job, host=host, count=n)


# --- requests ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"gpus": (1,), "count": 1}, {"count": 1, "cpu": True}, {"gpus": (0,), "cpu": True}],
)
def test_request_needs_exactly_one_kind(kwargs: dict[str, object]) -> None:
    with pytest.raises(RequestError, match="exactly one of gpus, count or cpu") as info:
        Request(job="train", host="node1", **kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == EXIT_INVALID


def test_empty_gpu_list_is_refused() -> None:
    with pytest.raises(RequestError, match="empty GPU list"):
        explicit()


def test_duplicate_gpus_are_refused() -> None:
    with pytest.raises(RequestError, match="lists GPU 1 more than once"):
        explicit(1, 3, 1)


def test_negative_gpu_index_is_refused() -> None:
    with pytest.raises(RequestError, match="GPU -1"):
        explicit(-1)


@pytest.mark.parametrize("n", [0, -2])
def test_count_below_one_is_refused(n: int) -> None:
    with pytest.raises(RequestError, match=f"count={n}"):
        count(n)


def test_request_describes_itself_as_typed() -> None:
    assert explicit(1, 3).describe() == "gpus=1,3"
    assert count(2).describe() == "count=2"
    assert Request(job="train", host="node1", cpu=True).describe() == "cpu"


# --- hosts ---------------------------------------------------------------------


def test_unknown_host_is_refused_naming_known_hosts() -> None:
    with pytest.raises(RequestError) as info:
        place(make_policy(), explicit(0, host="node9"), {}, NOW)
    assert str(info.value) == "host 'node9' is not in the policy (hosts: node1, node2)"


def test_cpu_request_on_unknown_host_is_refused() -> None:
    with pytest.raises(RequestError, match="node9"):
        place(make_policy(), Request(job="train", host="node9", cpu=True), {}, NOW)


def test_a_host_the_policy_does_not_name_is_refused_even_with_an_inventory() -> None:
    # A host removed from the policy whose agent still reports its GPUs takes nothing.
    with pytest.raises(RequestError, match=r"host 'gpu-box' is not in the policy \(hosts: node1"):
        place(make_policy(), count(2, host="gpu-box"), {}, NOW, inventory=inventory(2))


def test_a_policy_naming_no_host_goes_by_the_agents_inventory() -> None:
    result = place(Policy(version=1), count(2, host="gpu-box"), {}, NOW, inventory=inventory(2))
    assert result == Placement(gpus=(0, 1), mode="gpu", picked="no topology known")


def test_inventory_wins_over_declared_count() -> None:
    policy = make_policy()
    assert host_gpu_indices(policy, "node1", None) == (0, 1, 2, 3)
    assert host_gpu_indices(policy, "node1", inventory(2)) == (0, 1)
    with pytest.raises(RequestError, match=r"GPU 3 does not exist on node1 \(GPUs 0-1\)"):
        place(policy, explicit(3), {}, NOW, inventory=inventory(2))
    assert place(policy, explicit(6), {}, NOW, inventory=inventory(8)).gpus == (6,)


def test_empty_inventory_means_no_gpus() -> None:
    with pytest.raises(RequestError, match=r"node1 has 0 \(no GPUs\)"):
        place(make_policy(), count(1), {}, NOW, inventory=())


# --- explicit GPUs ---------------------------------------------------------------


def test_explicit_gpus_are_given_in_the_order_asked() -> None:
    assert place(make_policy(), explicit(2, 0), {}, NOW) == Placement(gpus=(2, 0), mode="gpu")


def test_missing_gpu_is_refused_with_the_hosts_gpus() -> None:
    with pytest.raises(RequestError) as info:
        place(make_policy(), explicit(1, 9), {}, NOW)
    assert str(info.value) == "GPU 9 does not exist on node1 (GPUs 0-3)"


def test_several_missing_gpus_are_named_together() -> None:
    with pytest.raises(RequestError, match="GPU 8, 9 do not exist on node1"):
        place(make_policy(), explicit(8, 9), {}, NOW)


def test_gpu_held_by_another_job_is_refused_naming_the_holder() -> None:
    with pytest.raises(PlacementRefused) as info:
        place(make_policy(), explicit(0, 1), on(held("infer", 1)), NOW)
    assert str(info.value) == (
        "GPU 1 on node1 is held by job 'infer' (since 2026-05-31T10:00:00Z, by alice)"
    )
    assert info.value.exit_code == EXIT_CONFLICT


def test_jobs_own_assignment_does_not_conflict() -> None:
    current = on(held("train", 1, 3), held("infer", 0))
    assert place(make_policy(), explicit(1, 3), current, NOW).gpus == (1, 3)
    assert place(make_policy(), explicit(3, 2), current, NOW).gpus == (3, 2)


def test_cpu_mode_assignment_holds_no_gpu() -> None:
    result = place(make_policy(), explicit(1), on(held("infer", 1, mode="cpu")), NOW)
    assert result.gpus == (1,)


def test_shared_pool_allows_holding_together_with_a_note() -> None:
    result = place(make_policy(sharing=SHARED), explicit(1), on(held("infer", 1)), NOW)
    assert result.gpus == (1,)
    assert len(result.notes) == 1
    assert "GPU 1 on node1 is shared with job 'infer'" in result.notes[0]


def test_gpu_reserved_for_others_is_refused_naming_the_reservation() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    with pytest.raises(PlacementRefused) as info:
        place(policy, explicit(3), {}, NOW)
    assert str(info.value) == (
        "GPU 3 on node1 is reserved by 'nightly-eval' for eval-* until 2027-01-01T00:00:00Z"
    )


def test_reservation_admits_jobs_matching_its_globs() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    assert place(policy, explicit(3, job="eval-gpt"), {}, NOW).gpus == (3,)
    with pytest.raises(PlacementRefused, match="nightly-eval"):
        place(policy, explicit(3, job="evaluate"), {}, NOW)


@pytest.mark.parametrize(
    ("now", "applies"),
    [
        (datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC), False),  # before start
        (datetime(2027, 1, 1, tzinfo=UTC), True),  # start is inclusive
        (datetime(2027, 1, 1, 6, tzinfo=UTC), True),  # inside
        (datetime(2027, 1, 2, tzinfo=UTC), False),  # until is exclusive
        (datetime(2027, 2, 1, tzinfo=UTC), False),  # after
    ],
)
def test_reservation_applies_only_inside_its_window(now: datetime, applies: bool) -> None:
    window = Reservation(
        name="maintenance",
        host="node1",
        gpus=(0,),
        for_jobs=("ops-*",),
        start=NEW_YEAR,
        until=NEW_YEAR + timedelta(days=1),
    )
    policy = make_policy(reservations=(window,))
    if applies:
        with pytest.raises(PlacementRefused, match="maintenance"):
            place(policy, explicit(0), {}, now)
    else:
        assert place(policy, explicit(0), {}, now).gpus == (0,)


def test_reservation_on_another_host_does_not_apply() -> None:
    elsewhere = Reservation(name="r", host="node2", gpus=(3,), for_jobs=("eval-*",))
    assert place(make_policy(reservations=(elsewhere,)), explicit(3), {}, NOW).gpus == (3,)


def test_reservation_without_end_says_so() -> None:
    forever = Reservation(name="keep", host="node1", gpus=(2,), for_jobs=("a", "b*"))
    with pytest.raises(PlacementRefused, match="reserved by 'keep' for a, b\\* with no end"):
        place(make_policy(reservations=(forever,)), explicit(2), {}, NOW)


def test_reservation_applies_in_a_shared_pool_too() -> None:
    policy = make_policy(sharing=SHARED, reservations=(NIGHTLY,))
    with pytest.raises(PlacementRefused, match="nightly-eval"):
        place(policy, explicit(3), {}, NOW)


def test_several_conflicts_are_reported_on_one_line() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    with pytest.raises(PlacementRefused) as info:
        place(policy, explicit(1, 3), on(held("infer", 1)), NOW)
    message = str(info.value)
    assert "\n" not in message
    assert "job 'infer'" in message and "nightly-eval" in message


def test_explicit_request_over_pool_limit_is_refused() -> None:
    with pytest.raises(RequestError) as info:
        place(make_policy(max_gpus=4), explicit(*range(6), host="node2"), {}, NOW)
    assert str(info.value) == "job 'train' asks for 6 GPUs; pool 'a100' allows at most 4 per job"


def test_explicit_unhealthy_gpu_is_allowed_with_a_note() -> None:
    result = place(make_policy(), explicit(2), {}, NOW, unhealthy={2: "XID 79"})
    assert result.gpus == (2,)
    assert result.notes == ("GPU 2 on node1 is unhealthy: XID 79",)


# --- count=N ---------------------------------------------------------------------


def test_count_takes_lowest_free_indices() -> None:
    expected = Placement(gpus=(0, 1), mode="gpu", picked="no topology known")
    assert place(make_policy(), count(2), {}, NOW) == expected


def test_count_skips_held_reserved_and_unhealthy_gpus() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    result = place(policy, count(4, host="node2"), {}, NOW)
    assert result.gpus == (0, 1, 2, 3)  # the reservation is on node1 only
    node1 = on(held("infer", 0))
    assert place(policy, count(1), node1, NOW, unhealthy={1: "XID 48"}).gpus == (2,)


def test_count_keeps_the_jobs_current_gpus() -> None:
    assert place(make_policy(), count(2), on(held("train", 2, 3)), NOW).gpus == (2, 3)
    assert place(make_policy(), count(3), on(held("train", 2, 3)), NOW).gpus == (0, 2, 3)


def test_topology_outranks_keeping_the_jobs_gpus() -> None:
    gpus = inventory(4, numa=(0, 0, 1, 1))
    result = place(make_policy(), count(2), on(held("train", 0, 2)), NOW, inventory=gpus)
    assert result.gpus == (0, 1)


def test_count_in_shared_pool_prefers_unshared_gpus_then_shares() -> None:
    policy = make_policy(sharing=SHARED)
    assert place(policy, count(2), on(held("infer", 0, 1)), NOW).gpus == (2, 3)
    busy = on(held("infer", 0, 1, 2, 3), held("eval-a", 0))
    assert place(policy, count(2), busy, NOW).gpus == (1, 2)


def test_count_over_pool_limit_is_refused() -> None:
    with pytest.raises(RequestError, match="pool 'a100' allows at most 2 per job"):
        place(make_policy(max_gpus=2, fallback_action="cpu"), count(3), {}, NOW)


def test_count_larger_than_host_is_impossible() -> None:
    with pytest.raises(RequestError) as info:
        place(make_policy(), count(5), {}, NOW)
    assert str(info.value) == "job 'train' asks for 5 GPUs; node1 has 4 (GPUs 0-3)"


def test_count_larger_than_host_falls_back_to_cpu_when_rule_says_cpu() -> None:
    result = place(make_policy(fallback_action="cpu"), count(5), {}, NOW)
    assert result == Placement(gpus=(), mode="cpu", fallback_reason="node1 has 4 GPUs: 5 requested")


def test_not_enough_free_gpus_is_refused_naming_what_holds_them() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    current = on(held("infer", 0), held("train", 2))
    with pytest.raises(PlacementRefused) as info:
        place(policy, count(3), current, NOW, unhealthy={1: "XID 79"})
    assert str(info.value) == (
        "not enough free GPUs on node1 for job 'train': 3 requested, 1 free "
        "(0: held by job 'infer'; 1: unhealthy: XID 79; "
        "3: reserved by 'nightly-eval' for eval-* until 2027-01-01T00:00:00Z)"
    )


def test_not_enough_free_gpus_falls_back_to_cpu_when_rule_says_cpu() -> None:
    current = on(held("infer", 0, 1), held("eval-a", 3))
    result = place(make_policy(fallback_action="cpu"), count(3), current, NOW)
    assert result.mode == "cpu"
    assert result.gpus == ()
    assert result.fallback_reason == (
        "not enough free GPUs on node1: 3 requested, 1 free "
        "(0: held by job 'infer'; 1: held by job 'infer'; 3: held by job 'eval-a')"
    )


@pytest.mark.parametrize("action", ["wait", "fail"])
def test_fallback_rules_other_than_cpu_refuse(action: FallbackAction) -> None:
    with pytest.raises(PlacementRefused, match="held by job 'infer'"):
        place(make_policy(fallback_action=action), count(4), on(held("infer", 0)), NOW)


def test_undeclared_job_has_no_fallback() -> None:
    policy = make_policy(fallback_action="cpu")
    with pytest.raises(PlacementRefused, match="for job 'adhoc'"):
        place(policy, count(4, job="adhoc"), on(held("infer", 0)), NOW)


def test_count_prefers_one_numa_node() -> None:
    gpus = inventory(4, numa=(0, 0, 1, 1))
    result = place(make_policy(), count(2), on(held("infer", 1)), NOW, inventory=gpus)
    assert result.gpus == (2, 3)


def test_count_spans_numa_nodes_when_it_must() -> None:
    gpus = inventory(4, numa=(0, 0, 1, 1))
    result = place(make_policy(), count(3), on(held("infer", 1)), NOW, inventory=gpus)
    assert result.gpus == (0, 2, 3)


def test_count_prefers_nvlink_connected_gpus() -> None:
    gpus = inventory(4, links={0: (3,), 3: (0,), 1: (2,), 2: (1,)})
    assert place(make_policy(), count(2), {}, NOW, inventory=gpus).gpus == (0, 3)
    result = place(make_policy(), count(2), on(held("infer", 0)), NOW, inventory=gpus)
    assert result.gpus == (1, 2)


def test_count_prefers_a_fully_connected_nvlink_clique() -> None:
    cliques = {
        i: tuple(j for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i) for i in range(8)
    }
    gpus = inventory(8, links=cliques)
    result = place(make_policy(), count(4, host="node2"), on(held("x", 1)), NOW, inventory=gpus)
    assert result.gpus == (4, 5, 6, 7)


def test_nvlink_outranks_numa() -> None:
    gpus = inventory(4, numa=(0, 0, 1, 1), links={1: (2,), 2: (1,)})
    assert place(make_policy(), count(2), {}, NOW, inventory=gpus).gpus == (1, 2)


def test_large_host_uses_greedy_search_and_keeps_numa_preference() -> None:
    gpus = inventory(24, numa=[0] * 12 + [1] * 12)
    policy = Policy(version=1, hosts={"big": Host("big", 24)})
    result = place(policy, count(12, host="big"), on(held("x", 0)), NOW, inventory=gpus)
    assert result.gpus == tuple(range(12, 24))


# --- cpu ---------------------------------------------------------------------------


def test_cpu_request_is_always_cpu() -> None:
    everything = on(held("infer", 0, 1, 2, 3))
    result = place(make_policy(), Request(job="train", host="node1", cpu=True), everything, NOW)
    assert result == Placement(gpus=(), mode="cpu")


def test_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        place(make_policy(), count(1), {}, datetime(2026, 1, 1))


# --- helpers for status ------------------------------------------------------------


def test_gpu_holders_lists_jobs_per_gpu_ignoring_cpu_mode() -> None:
    current = on(held("b", 1, 2), held("a", 2), held("c", 3, mode="cpu"))
    assert gpu_holders(current) == {1: ["b"], 2: ["a", "b"]}


def test_gpu_blockers_explain_each_unavailable_gpu() -> None:
    policy = make_policy(reservations=(NIGHTLY,))
    blockers = gpu_blockers(policy, "node1", "train", on(held("a", 0), held("train", 1)), NOW)
    assert blockers == {
        0: "held by job 'a'",
        3: "reserved by 'nightly-eval' for eval-* until 2027-01-01T00:00:00Z",
    }


# --- property: whatever place returns is legal -----------------------------------------


JOBS = ("train", "eval-a", "bench", "infer")
ACTIONS: tuple[FallbackAction, ...] = ("cpu", "wait", "fail")
MOMENTS = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
)


@st.composite
def reservations(draw: st.DrawFn) -> Reservation:
    return Reservation(
        name=f"r{draw(st.integers(0, 99))}",
        host=draw(st.sampled_from(["node1", "node2"])),
        gpus=tuple(draw(st.sets(st.integers(0, 5), min_size=1, max_size=2))),
        for_jobs=tuple(draw(st.sets(st.sampled_from(["eval-*", "train", "b*"]), min_size=1))),
        start=draw(st.none() | MOMENTS),
        until=draw(st.none() | MOMENTS),
    )


@st.composite
def gpu_inventories(draw: st.DrawFn) -> tuple[GpuInfo, ...] | None:
    if draw(st.booleans()):
        return None
    size = draw(st.integers(0, 8))
    return tuple(
        GpuInfo(
            index=i,
            numa_node=draw(st.sampled_from([None, 0, 1])),
            nvlink_peers=tuple(draw(st.sets(st.integers(0, max(size - 1, 0)), max_size=3))),
        )
        for i in range(size)
    )


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    action = draw(st.sampled_from(ACTIONS))
    return Policy(
        version=1,
        hosts={"node1": Host("node1", draw(st.integers(0, 7)), pool="p")},
        pools={
            "p": Pool(
                "p",
                ("node1",),
                sharing=draw(st.sampled_from([Sharing(), SHARED])),
                max_gpus_per_job=draw(st.none() | st.integers(1, 6)),
            )
        },
        reservations=tuple(draw(st.lists(reservations(), max_size=2))),
        jobs={"train": Job("train", ("python", "train.py"), fallback="rule")},
        fallback={"rule": FallbackRule("rule", action)},
    )


@st.composite
def current_assignments(draw: st.DrawFn) -> dict[str, Assignment]:
    """Who holds each of GPUs 0-6 (mostly nobody), as one assignment per holding job."""
    owners = draw(st.lists(st.sampled_from([None, None, None, *JOBS]), min_size=7, max_size=7))
    jobs = sorted({owner for owner in owners if owner is not None})
    return {
        job: held(
            job,
            *(gpu for gpu, owner in enumerate(owners) if owner == job),
            mode=draw(st.sampled_from(["gpu", "gpu", "gpu", "cpu"])),
        )
        for job in jobs
    }


@st.composite
def requests(draw: st.DrawFn) -> Request:
    job = draw(st.sampled_from(JOBS))
    kind = draw(st.sampled_from(["gpus", "gpus", "count", "count", "cpu"]))
    if kind == "gpus":
        gpus = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3, unique=True)))
        return Request(job=job, host="node1", gpus=gpus)
    if kind == "count":
        return Request(job=job, host="node1", count=draw(st.integers(1, 7)))
    return Request(job=job, host="node1", cpu=True)


def usable_for(
    policy: Policy,
    job: str,
    gpu: int,
    current: Mapping[str, Assignment],
    now: datetime,
) -> bool:
    """Independent restatement of the rules: may ``job`` hold ``gpu`` on node1 now?"""
    exclusive = not policy.pools["p"].sharing.shared
    held_by_other = any(
        a.mode == "gpu" and gpu in a.gpus for name, a in current.items() if name != job
    )
    reserved = any(
        r.host == "node1" and gpu in r.gpus and r.active(now) and not r.admits(job)
        for r in policy.reservations
    )
    return not (exclusive and held_by_other) and not reserved


def expected_outcome(
    policy: Policy,
    request: Request,
    existing: Sequence[int],
    usable: Sequence[int],
    free: Sequence[int],
) -> str:
    """Independent restatement of place's decision: 'gpu', 'cpu' or the error's name."""
    limit = policy.pools["p"].max_gpus_per_job or 99
    falls_back = request.job == "train" and policy.fallback["rule"].action == "cpu"
    if request.gpus is not None:
        if any(g not in existing for g in request.gpus) or len(request.gpus) > limit:
            return "RequestError"
        # explicit requests ignore health, but not holders or reservations
        return "gpu" if all(g in usable for g in request.gpus) else "PlacementRefused"
    if request.count is None:
        return "cpu"
    if request.count > limit or (request.count > len(existing) and not falls_back):
        return "RequestError"
    if len(free) >= request.count:
        return "gpu"
    return "cpu" if falls_back else "PlacementRefused"


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(
    policy=policies(),
    request=requests(),
    current=current_assignments(),
    now=MOMENTS,
    gpus=gpu_inventories(),
    sick=st.dictionaries(st.integers(0, 7), st.just("XID 79"), max_size=2),
)
def test_place_decides_exactly_as_the_rules_say(
    policy: Policy,
    request: Request,
    current: dict[str, Assignment],
    now: datetime,
    gpus: tuple[GpuInfo, ...] | None,
    sick: dict[int, str],
) -> None:
    existing = host_gpu_indices(policy, "node1", gpus)
    usable = [g for g in existing if usable_for(policy, request.job, g, current, now)]
    free = [g for g in usable if g not in sick]
    expected = expected_outcome(policy, request, existing, usable, free)
    try:
        result = place(policy, request, current, now, inventory=gpus, unhealthy=sick)
    except (PlacementRefused, RequestError) as exc:
        assert type(exc).__name__ == expected
        return
    assert result.mode == expected
    if result.mode == "cpu":
        assert result.gpus == ()
        return
    assert len(set(result.gpus)) == len(result.gpus)
    assert all(gpu in usable for gpu in result.gpus)
    if request.count is not None:
        assert len(result.gpus) == request.count
        assert all(gpu in free for gpu in result.gpus)
    else:
        assert result.gpus == request.gpus
