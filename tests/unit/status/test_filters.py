"""Status filters: parsing, host patterns, the hosts a filter reads, and rows kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from allocator.errors import InvalidInput
from allocator.policy.model import Host, Policy, Pool, Reservation, Sharing
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.status.filters import (
    StatusFilter,
    filter_hosts,
    gpu_states,
    host_matcher,
    hosts_to_read,
    parse_filter,
    pool_by_host,
    split_list,
)
from allocator.status.join import build_status
from allocator.store import KeyValue

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LAYOUT = KeyLayout("/a")
POLICY = Policy(
    version=1,
    hosts={
        "n1": Host("n1", 4, pool="a100"),
        "n2": Host("n2", 2, pool="a100"),
        "m1": Host("m1", 2),
    },
    pools={"a100": Pool("a100"), "h100": Pool("h100", hosts=("m1",))},
    reservations=(Reservation("evals", "n1", (2,), ("eval-*",)),),
)


def _kv(key: str, raw: bytes, lease: int | None = None) -> KeyValue:
    return KeyValue(key, raw, 1, 1, lease)


def _assignment(job: str, host: str, gpus: tuple[int, ...], **extra: object) -> KeyValue:
    record = Assignment(
        job=job,
        host=host,
        gpus=gpus,
        mode=extra.pop("mode", "gpu"),  # type: ignore[arg-type]
        updated_by="ops@x",
        updated_at="2026-06-01T11:00:00Z",
        **extra,  # type: ignore[arg-type]
    )
    return _kv(LAYOUT.assignment(host, job), record.to_json())


def _fleet() -> list[KeyValue]:
    agent = AgentRecord(
        host="n1", gpus=tuple(GpuInfo(i) for i in range(4)), unhealthy={3: "xid 79"}
    )
    idle = WorkerRecord(
        job="infer", host="n1", state="running", gpus=(1,), idle_since="2026-06-01T11:00:00Z"
    )
    on_cpu = WorkerRecord(
        job="train", host="n2", state="running", gpus=(0,), device="cpu", fallback_reason="xid"
    )
    return [
        _assignment("train", "n1", (0,)),
        _assignment("infer", "n1", (1,)),
        _kv(LAYOUT.agent("n1"), agent.to_json(), 7),
        _kv(LAYOUT.workers("n1", "infer"), idle.to_json()),
        _assignment("train", "n2", (0,)),
        _kv(LAYOUT.workers("n2", "train"), on_cpu.to_json()),
        _assignment("eval", "m1", (), mode="cpu", fallback_reason="no GPU free"),
    ]


def _status() -> list:  # type: ignore[type-arg]
    return build_status(POLICY, _fleet(), LAYOUT, NOW)


def test_filters_parse_comma_lists_of_each_key() -> None:
    parsed = parse_filter(
        {"host": "node[01-04,10],gpu*", "pool": "a,b", "job": "j", "state": "free,idle,free"}
    )
    assert parsed == StatusFilter(("node[01-04,10]", "gpu*"), ("a", "b"), ("j",), ("free", "idle"))
    assert parse_filter({}).empty and not parsed.empty


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ({"state": "busy"}, "state=busy: not a GPU state"),
        ({"job": "a/b"}, "job=a/b"),
        ({"pool": ""}, "pool=: an empty item"),
        ({"host": "a,,b"}, "an empty item"),
        ({"host": "node[9-1]"}, "runs backwards"),
        ({"host": "node{1}*"}, "not a host name, glob"),
        ({"host": "n[0-99999999]"}, "at most 1,000,000"),
        ({"host": "n/1"}, "host=n/1"),
    ],
)
def test_bad_filter_values_are_one_line_invalid_input(words: dict[str, str], said: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_filter(words)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_commas_inside_brackets_do_not_split() -> None:
    assert split_list("n[1-4,7],m1") == ["n[1-4,7]", "m1"]


def test_host_patterns_are_names_globs_and_ranges() -> None:
    matches = host_matcher(["node[0098-0101]", "gpu-?", "db1", "x[ab]"])
    assert [h for h in ("node0098", "node0101", "node0102", "node98") if matches(h)] == [
        "node0098",
        "node0101",
    ]
    assert matches("gpu-7") and not matches("gpu-17")
    assert matches("db1") and not matches("db10")
    assert matches("xa") and not matches("xc")


def test_hosts_to_read_picks_from_the_policy_and_the_job_index() -> None:
    declared = ["n1", "n2", "m1"]
    pools = pool_by_host(POLICY)
    assert pools == {"n1": "a100", "n2": "a100", "m1": "h100"}
    assert hosts_to_read(StatusFilter(), declared) is None
    assert hosts_to_read(StatusFilter(states=("free",)), declared) is None
    assert hosts_to_read(StatusFilter(hosts=("n*",)), declared) == ["n1", "n2"]
    assert hosts_to_read(StatusFilter(hosts=("zz",)), declared) == ["zz"]  # a name: read it
    assert hosts_to_read(StatusFilter(pools=("h100",)), declared, pools) == ["m1"]
    both = StatusFilter(hosts=("n1", "m1"), pools=("a100",))
    assert hosts_to_read(both, declared, pools) == ["n1"]
    job = StatusFilter(jobs=("train",))
    assert hosts_to_read(job, declared, pools, job_hosts=["n2", "n1"]) == ["n1", "n2"]
    assert hosts_to_read(job, declared, pools, job_hosts=None) is None


def test_each_gpu_has_its_states() -> None:
    m1, n1, n2 = _status()
    holding = {g.gpu: [j for j in n1.jobs if g.gpu in j.gpus.split(",")] for g in n1.gpus}
    states = {g.gpu: gpu_states(g, holding[g.gpu]) for g in n1.gpus}
    assert states == {"0": {"held"}, "1": {"held", "idle"}, "2": {"free"}, "3": {"unhealthy"}}
    assert gpu_states(n2.gpus[0], n2.jobs) == {"held", "fallback"}
    (cpu_row,) = [g for g in m1.gpus if g.gpu == "cpu"]
    assert gpu_states(cpu_row, m1.jobs) == {"fallback"}


def _shown(hosts: list) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {h.host: [g.gpu for g in h.gpus] for h in hosts}


def test_state_and_job_filters_keep_matching_rows_and_the_jobs_holding_them() -> None:
    hosts = _status()
    free = filter_hosts(hosts, StatusFilter(states=("free",)))
    assert _shown(free) == {"m1": ["0", "1"], "n1": ["2"], "n2": ["1"]}
    assert all(not h.jobs for h in free)
    held = filter_hosts(hosts, StatusFilter(jobs=("train",)))
    assert _shown(held) == {"n1": ["0"], "n2": ["0"]}
    assert [j.job for h in held for j in h.jobs] == ["train", "train"]
    fallback = filter_hosts(hosts, StatusFilter(states=("fallback",)))
    assert _shown(fallback) == {"m1": ["cpu"], "n2": ["0"]}
    assert filter_hosts(hosts, StatusFilter(states=("unhealthy",), pools=("h100",))) == []


def test_host_and_pool_filters_keep_whole_hosts() -> None:
    hosts = _status()
    kept = filter_hosts(hosts, StatusFilter(pools=("a100",)), pool_by_host(POLICY))
    assert _shown(kept) == {"n1": ["0", "1", "2", "3"], "n2": ["0", "1"]}
    assert _shown(filter_hosts(hosts, StatusFilter(hosts=("m*",)))) == {"m1": ["0", "1", "cpu"]}


def _held_by_users() -> list:  # type: ignore[type-arg]
    fleet = [
        _assignment("train", "n1", (0, 1), holder="alice"),
        _assignment("infer", "n1", (2,), holder="bob"),
        _assignment("eval", "m1", (), mode="cpu", holder="alice"),
        _assignment("old", "n2", (0,)),  # written before holders were kept
    ]
    return build_status(POLICY, fleet, LAYOUT, NOW)


def test_user_filter_parses_a_comma_list_of_names() -> None:
    assert parse_filter({"user": "alice,bob,alice"}).users == ("alice", "bob")
    assert parse_filter({"user": "alice"}).trims_rows
    with pytest.raises(InvalidInput, match="user=a/b"):
        parse_filter({"user": "a/b"})


def test_every_row_and_job_names_who_holds_it() -> None:
    m1, n1, n2 = _held_by_users()
    assert [(g.gpu, g.holder, g.user) for g in n1.gpus] == [
        ("0", "train", "alice"),
        ("1", "train", "alice"),
        ("2", "infer", "bob"),
        ("3", None, None),
    ]
    assert [(g.gpu, g.user) for g in m1.gpus if g.gpu == "cpu"] == [("cpu", "alice")]
    assert [(j.job, j.user) for j in n1.jobs] == [("infer", "bob"), ("train", "alice")]
    assert n2.gpus[0].user is None


def test_user_filter_keeps_the_rows_and_jobs_that_user_holds() -> None:
    hosts = _held_by_users()
    alice = filter_hosts(hosts, StatusFilter(users=("alice",)))
    assert _shown(alice) == {"m1": ["cpu"], "n1": ["0", "1"]}
    assert [j.job for h in alice for j in h.jobs] == ["eval", "train"]
    both = filter_hosts(hosts, StatusFilter(users=("alice", "bob"), hosts=("n1",)))
    assert _shown(both) == {"n1": ["0", "1", "2"]}
    assert filter_hosts(hosts, StatusFilter(users=("carol",))) == []
    assert hosts_to_read(StatusFilter(users=("alice",)), ["n1", "n2", "m1"]) is None


def test_a_shared_gpu_names_each_user_once() -> None:
    policy = Policy(
        version=1,
        hosts={"s1": Host("s1", 1, pool="shared")},
        pools={"shared": Pool("shared", sharing=Sharing("mps", 4))},
    )
    fleet = [
        _assignment("a", "s1", (0,), holder="alice"),
        _assignment("b", "s1", (0,), holder="bob"),
        _assignment("c", "s1", (0,), holder="alice"),
    ]
    (s1,) = build_status(policy, fleet, LAYOUT, NOW)
    assert (s1.gpus[0].holder, s1.gpus[0].user) == ("a,b,c", "alice,bob")
    bob = filter_hosts([s1], StatusFilter(users=("bob",)))
    assert [j.job for h in bob for j in h.jobs] == ["b"]
