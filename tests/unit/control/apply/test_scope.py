"""``policy apply`` costs what changed: which hosts it checks, and how much one call reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from allocator.control.apply import scope as apply_scope
from allocator.control.apply.scope import affected_hosts
from allocator.control.client import Allocator
from allocator.errors import PlacementRefused
from allocator.policy import load_policy
from allocator.records.keys import KeyLayout
from allocator.store import Listing, Read, Store, open_store
from bench.fleet import fleet_policy, load_fleet

BASE = """
version: 1
hosts:
  a: {gpus: 4, pool: p}
  b: {gpus: 4, pool: p}
  c: {gpus: 4}
  d: {gpus: 4, pool: q}
pools:
  p: {max_gpus_per_job: 4}
  q: {}
jobs:
  train: {command: [x]}
"""


@pytest.mark.parametrize(
    ("old", "new", "hosts"),
    [
        ("a: {gpus: 4", "a: {gpus: 2", {"a"}),  # one host's entry
        ("c: {gpus: 4}", "c: {gpus: 4, pool: q}", {"c"}),  # a host joins a pool
        ("max_gpus_per_job: 4", "max_gpus_per_job: 2", {"a", "b"}),  # a pool's rule
        ("jobs:", "reservations: [{name: r, host: d, gpus: [0], for: [x]}]\njobs:", {"d"}),
        ("command: [x]", "command: [y]", set()),  # placement does not read commands
    ],
)
def test_a_change_affects_the_hosts_whose_placement_it_changes(
    old: str, new: str, hosts: set[str]
) -> None:
    assert BASE.count(old) == 1
    before, after = load_policy(BASE), load_policy(BASE.replace(old, new))
    assert affected_hosts(before, after) == hosts


def test_a_first_apply_or_a_change_of_what_placement_reads_of_jobs_affects_every_host() -> None:
    policy = load_policy(BASE)
    assert affected_hosts(None, policy) is None
    whole = load_policy(BASE.replace("command: [x]}", "command: [x], exclusive: true}"))
    assert affected_hosts(policy, whole) is None
    workers = load_policy(BASE.replace("command: [x]}", "command: [x], workers: per-gpu}"))
    assert affected_hosts(policy, workers) is None
    added = load_policy(BASE + "  eval: {command: [y]}\n")
    assert affected_hosts(policy, added) is None


class Counting:
    """A store that records how many host keys each call returned."""

    def __init__(self, store: Store, layout: KeyLayout) -> None:
        self._store = store
        self._hosts = layout.hosts
        self.calls: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _count(self, listings: Sequence[Listing]) -> None:
        found = sum(1 for one in listings for kv in one.items if kv.key.startswith(self._hosts))
        if found:
            self.calls.append(found)

    def list(self, prefix: str, **kw: Any) -> Listing:
        listing = self._store.list(prefix, **kw)
        self._count([listing])
        return listing

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        found = self._store.read_many(reads)
        self._count(found)
        return found

    def list_parts(self, prefix: str, revision: int, splits: Sequence[str]) -> Iterator[Listing]:
        for listing in self._store.list_parts(prefix, revision, splits):
            self._count([listing])
            yield listing


def _host_keys(store: Store, layout: KeyLayout, host: str) -> int:
    return len(store.list(layout.host(host)).items)


def test_a_one_host_change_reads_only_that_hosts_keys() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    fleet = load_fleet(store, "/f", hosts=40, jobs_per_host=4)
    layout = KeyLayout(fleet.prefix)
    counting = Counting(store, layout)
    changed = fleet_policy(40).replace("node0007: {gpus: 8}", "node0007: {gpus: 9}")
    Allocator(counting, prefix=fleet.prefix, actor="ops@h").apply_policy(changed, "f.yaml")  # type: ignore[arg-type]
    assert sum(counting.calls) == _host_keys(store, layout, "node0007")


def test_a_one_host_change_that_breaks_an_assignment_there_is_refused_naming_it() -> None:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    fleet = load_fleet(store, "/f", hosts=40, jobs_per_host=4)
    reserved = fleet_policy(40).replace(
        "jobs:", "reservations: [{name: r, host: node0007, gpus: [0], for: [eval]}]\njobs:"
    )
    allocator = Allocator(store, prefix=fleet.prefix, actor="ops@h")
    with pytest.raises(PlacementRefused, match=r"job0007-0@node0007") as info:
        allocator.apply_policy(reserved, "f.yaml")
    assert "1 current assignment(s)" in str(info.value)


def test_every_host_is_read_in_calls_of_bounded_size_on_etcd(
    etcd_server: Any, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget scales with the work: more calls, none of them larger, as the fleet grows."""
    monkeypatch.setattr(apply_scope, "HOSTS_PER_CALL", 10)
    store = open_store(etcd_server.url)
    try:
        load_fleet(store, prefix, hosts=60, jobs_per_host=2)
        layout = KeyLayout(prefix)
        per_host = _host_keys(store, layout, "node0000")
        counting = Counting(store, layout)
        whole = fleet_policy(60).replace("fallback: wait", "fallback: wait\n    exclusive: true")
        Allocator(counting, prefix=prefix, actor="ops@h").apply_policy(whole, "f.yaml")  # type: ignore[arg-type]
        assert sum(counting.calls) == 60 * per_host
        assert len(counting.calls) >= 6
        assert max(counting.calls) <= 11 * per_host, counting.calls
    finally:
        store.close()


def test_the_cli_apply_and_reapply_never_read_every_host_in_one_call(
    etcd_server: Any, prefix: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The apply also reports standing and upcoming conflicts: those reads are bounded too."""
    from allocator.cli import main
    from allocator.store.etcd.store import EtcdStore

    monkeypatch.setattr(apply_scope, "HOSTS_PER_CALL", 10)
    store = open_store(etcd_server.url)
    try:
        load_fleet(store, prefix, hosts=60, jobs_per_host=2)
        per_host = _host_keys(store, KeyLayout(prefix), "node0000")
    finally:
        store.close()
    calls: list[int] = []
    hosts = f"{prefix}/v1/hosts/"
    for name in ("list", "read_many", "read_range"):
        real = getattr(EtcdStore, name)

        def counted(self: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
            found = _real(self, *args, **kw)
            listings = found if isinstance(found, tuple) else (found,)
            keys = sum(1 for one in listings for kv in one.items if kv.key.startswith(hosts))
            if keys:
                calls.append(keys)
            return found

        monkeypatch.setattr(EtcdStore, name, counted)
    policy = tmp_path / "p.yaml"
    policy.write_text(
        fleet_policy(60).replace("fallback: wait", "fallback: wait\n    exclusive: true")
        + "reservations: [{name: r, host: node0003, gpus: [7], for: [eval],"
        " start: 2099-01-01T00:00:00Z}]\n"
    )
    monkeypatch.setenv("ALLOCATOR_PREFIX", prefix)
    for _ in range(2):  # applied, then unchanged (which checks every host again)
        assert main(["--store", etcd_server.url, "policy", "apply", str(policy)]) == 0
    assert calls and max(calls) <= 11 * per_host, calls


def test_an_apply_whose_revision_is_compacted_while_it_reads_tries_again(
    etcd_server_private: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from allocator.store.etcd.config import parse_etcd_url
    from allocator.store.etcd.store import EtcdStore

    class CompactsOnce(EtcdStore):
        reads = 0

        def list_parts(
            self, prefix: str, revision: int, splits: Sequence[str] = ()
        ) -> Iterator[Listing]:
            self.reads += 1
            if self.reads == 1:  # etcd's auto-compaction passing the revision apply reads at
                now = self.put("/elsewhere", b"x")
                etcd_server_private.etcdctl("compact", str(now))
            return super().list_parts(prefix, revision, splits)

    monkeypatch.setattr(apply_scope, "HOSTS_PER_CALL", 10)
    url = etcd_server_private.url
    plain = open_store(url)
    try:
        load_fleet(plain, "/f", hosts=30, jobs_per_host=2)
        plain.delete(KeyLayout("/f").policy)  # the next apply checks every host
    finally:
        plain.close()
    store = CompactsOnce(parse_etcd_url(url), url)
    try:
        result = Allocator(store, prefix="/f", actor="ops@h").apply_policy(fleet_policy(30), "f")
    finally:
        store.close()
    assert result.changed and store.reads >= 2
