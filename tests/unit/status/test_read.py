"""Where status cuts its read of the hosts, and that joining the parts changes nothing."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.policy.compiled import compile_policy
from allocator.policy.model import Host, Policy
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, WorkerRecord
from allocator.status.join import build_status, status_of_part
from allocator.status.read import (
    HOSTS_PER_PART,
    MAX_HOSTS_PER_PART,
    MAX_PARTS,
    declared_by_part,
    host_names,
    split_points,
)
from allocator.store import KeyValue
from allocator.store.etcd.parts import key_ranges
from tests.unit.status.test_join import NOW

LAYOUT = KeyLayout("/a")
# Names whose order by name and by key differ: "node1/" sorts after "node1-a/".
TRICKY = ["node1", "node1-a", "node1.b", "node10", "node1_c", "node2"]
NAMES = st.lists(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,6}", fullmatch=True), unique=True)


def _fleet(names: list[str]) -> list[KeyValue]:
    items = []
    for name in names:
        held = Assignment(
            job="train",
            host=name,
            gpus=(0,),
            mode="gpu",
            updated_by="ops@x",
            updated_at="2026-06-01T11:00:00Z",
        )
        worker = WorkerRecord(job="train", host=name, state="running", pids=(7,), gpus=(0,))
        items += [
            KeyValue(LAYOUT.agent(name), AgentRecord(host=name, gpus=()).to_json(), 1, 1, 9),
            KeyValue(LAYOUT.assignment(name, "train"), held.to_json(), 1, 1, None),
            KeyValue(LAYOUT.workers(name, "train"), worker.to_json(), 1, 1, None),
        ]
    return sorted(items, key=lambda kv: kv.key.encode())


def _in_range(key: str, bounds: tuple[bytes, bytes]) -> bool:
    return bounds[0] <= key.encode() < bounds[1]


def test_a_fleet_is_cut_into_parts_of_about_as_many_hosts() -> None:
    names = [f"node{n:04d}" for n in range(1000)]
    cuts = split_points(LAYOUT, reversed(names))
    assert cuts == [LAYOUT.host(names[1000 * n // MAX_PARTS]) for n in range(1, MAX_PARTS)]
    assert split_points(LAYOUT, names, max_parts=4) == [
        LAYOUT.host("node0250"),
        LAYOUT.host("node0500"),
        LAYOUT.host("node0750"),
    ]


def test_a_large_fleet_gets_more_parts_none_of_more_than_max_hosts_per_part() -> None:
    names = [f"node{n:05d}" for n in range(12_500)]
    cuts = split_points(LAYOUT, names)
    assert len(cuts) + 1 == -(-12_500 // MAX_HOSTS_PER_PART)
    sizes = [b - a for a, b in itertools.pairwise([0, *map(_position, cuts), 12_500])]
    assert max(sizes) <= MAX_HOSTS_PER_PART


def _position(key: str) -> int:
    return int(key.rstrip("/").rsplit("node", 1)[1])


def test_a_small_fleet_is_read_whole() -> None:
    names = [f"node{n}" for n in range(2 * HOSTS_PER_PART)]
    assert len(split_points(LAYOUT, names)) == 1
    assert split_points(LAYOUT, names[:-1]) == []


def test_names_that_are_no_host_names_are_no_cut() -> None:
    assert split_points(LAYOUT, ["a/b", "", "-x", *TRICKY], per_part=1, max_parts=10) == [
        key for key in sorted(LAYOUT.host(name) for name in TRICKY)[1:]
    ]


def test_host_names_come_from_a_compiled_policy_and_nothing_else() -> None:
    policy = Policy(version=1, hosts={"b": Host("b", 1), "a": Host("a", 2)})
    assert sorted(host_names(compile_policy(policy, "0" * 64))) == ["a", "b"]
    for junk in (b"", b"[]", b'{"policy": 3}', b'{"policy": {"hosts": []}}', b"\xff"):
        assert host_names(junk) == []


@given(NAMES, st.lists(st.text(min_size=1, max_size=12), max_size=6))
def test_key_ranges_cover_the_prefix_once_in_order(names: list[str], splits: list[str]) -> None:
    prefix = LAYOUT.hosts
    cuts = [LAYOUT.host(n) for n in names] + [f"{prefix}{s}" for s in splits] + splits + [prefix]
    ranges = key_ranges(prefix, cuts)
    assert ranges[0][0] == prefix.encode()
    assert ranges[-1][1] == b"/a/v1/hosts0"  # the first key after the prefix
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end == start
    assert all(start < end for start, end in ranges)


@given(NAMES)
def test_a_declared_host_is_joined_with_the_part_its_keys_are_read_in(names: list[str]) -> None:
    hosts = [*names, *TRICKY]
    cuts = split_points(LAYOUT, hosts, per_part=2)
    ranges = key_ranges(LAYOUT.hosts, cuts)
    for part, declared in zip(ranges, declared_by_part(LAYOUT, hosts, cuts), strict=True):
        assert all(_in_range(LAYOUT.agent(host), part) for host in declared)
    assert sorted(itertools.chain(*declared_by_part(LAYOUT, hosts, cuts))) == sorted(set(hosts))


@pytest.mark.parametrize("per_part", [1, 2, 3, 100])
def test_joining_the_parts_one_by_one_makes_the_rows_of_the_whole(per_part: int) -> None:
    stored = [*TRICKY, "solo", "zeta"]
    declared = [*TRICKY, "idle-1", "idle-z"]  # two declared hosts without any key
    policy = Policy(version=1, hosts={name: Host(name, 2) for name in declared})
    items = _fleet(stored)
    cuts = split_points(LAYOUT, declared, per_part=per_part, max_parts=8)
    rows = []
    for bounds, hosts in zip(
        key_ranges(LAYOUT.hosts, cuts), declared_by_part(LAYOUT, declared, cuts), strict=True
    ):
        part = [kv for kv in items if _in_range(kv.key, bounds)]
        rows += status_of_part(policy, part, LAYOUT, NOW, hosts)
    whole = build_status(policy, items, LAYOUT, NOW)
    assert sorted(rows, key=lambda host: host.host) == whole
    assert [host.host for host in whole] == sorted({*stored, *declared})
