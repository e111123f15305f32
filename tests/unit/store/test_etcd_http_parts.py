"""A prefix read as several key ranges at once on etcd's JSON gateway: one snapshot, or none."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.errors import Compacted
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.status.join import status_of_part
from allocator.status.read import read_status
from allocator.store import Delete, Listing, Put
from allocator.store.etcd.config import parse_etcd_url
from allocator.store.etcd.connection import Endpoint
from allocator.store.etcd.parts import AT_ONCE, key_ranges, list_in_parts
from allocator.store.etcd.store import EtcdStore, open_etcd
from bench.fleet import fleet_policy, host_name
from tests.support.etcd_server import free_port
from tests.unit.status.test_join import NOW


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}/k{n:03d}/v" for n in range(count)]


def _write(store: EtcdStore, prefix: str, count: int) -> Listing:
    store.txn([], [Put(key, key.encode()) for key in _names(prefix, count)])
    return store.list(prefix + "/")


CUTS = ("k010/", "k025/", "k026/", "k040/")


@pytest.mark.parametrize("at_once", [1, AT_ONCE, 8])
def test_parts_read_at_a_revision_hold_what_was_there_then(
    etcd_server: Any, prefix: str, at_once: int
) -> None:
    store = open_etcd(etcd_server.url)
    try:
        before = _write(store, prefix, 50)
        names = _names(prefix, 50)
        store.txn(
            [],
            [Put(names[3], b"changed"), Delete(names[30]), Put(f"{prefix}/k025/w", b"new")],
        )
        store.put(f"{prefix}/k999/v", b"new at the end")
        splits = [f"{prefix}/{cut}" for cut in CUTS]
        parts = list(list_in_parts(store, prefix + "/", before.revision, splits, at_once))
    finally:
        store.close()
    assert len(parts) == len(CUTS) + 1
    assert tuple(kv for part in parts for kv in part.items) == before.items
    assert {part.revision for part in parts} == {before.revision}
    for part, bounds in zip(parts, key_ranges(prefix + "/", splits), strict=True):
        assert all(bounds[0] <= kv.key.encode() < bounds[1] for kv in part.items)


class _DeadSpares(EtcdStore):
    """Spare connections go to a port nothing listens on."""

    def spare_connection(self) -> Endpoint:
        return Endpoint(parse_etcd_url(f"etcd://127.0.0.1:{free_port()}"), 0, None)


def test_a_part_whose_spare_connection_fails_is_read_on_the_stores_own(
    etcd_server: Any, prefix: str
) -> None:
    store = _DeadSpares(parse_etcd_url(etcd_server.url), etcd_server.url)
    try:
        before = _write(store, prefix, 30)
        store.put(f"{prefix}/k020/v", b"after")
        splits = [f"{prefix}/{cut}" for cut in CUTS[:2]]
        parts = list(store.list_parts(prefix + "/", before.revision, splits))
    finally:
        store.close()
    assert len(parts) == 3
    assert tuple(kv for part in parts for kv in part.items) == before.items


def test_parts_of_a_compacted_revision_raise_compacted(etcd_server_private: Any) -> None:
    store = open_etcd(etcd_server_private.url)
    try:
        before = _write(store, "/p", 30)
        now = store.put("/p/k001/v", b"later")
        etcd_server_private.etcdctl("compact", str(now))
        splits = [f"/p/{cut}" for cut in CUTS[:2]]
        with pytest.raises(Compacted):
            list(store.list_parts("/p/", before.revision, splits))
    finally:
        store.close()


class _CompactsFirst(EtcdStore):
    """Moves a job and compacts the history just before status reads the hosts."""

    layout = KeyLayout("/fleet")

    def list_parts(
        self, prefix: str, revision: int, splits: Sequence[str] = ()
    ) -> Iterator[Listing]:
        if not self.armed:  # the policy's apply, before status
            return super().list_parts(prefix, revision, splits)
        host = host_name(7)
        moved = Assignment(
            job="late",
            host=host,
            gpus=(5,),
            mode="gpu",
            updated_by="ops@x",
            updated_at="2026-06-01T11:00:00Z",
        )
        now = self.put(self.layout.assignment(host, "late"), moved.to_json())
        self.server.etcdctl("compact", str(now))
        return super().list_parts(prefix, revision, splits)

    server: Any = None
    armed = False


def test_status_whose_revision_is_compacted_meanwhile_reads_the_present(
    etcd_server_private: Any,
) -> None:
    store = _CompactsFirst(parse_etcd_url(etcd_server_private.url), etcd_server_private.url)
    store.server = etcd_server_private
    allocator = Allocator(store, prefix="/fleet", actor="ops@x")
    applied = allocator.apply_policy(fleet_policy(300, gpus=8), "fleet.yaml")
    layout = allocator.layout
    store.armed = True
    try:
        policy, revision, hosts = read_status(
            allocator,
            layout.hosts,
            only_host=None,
            while_reading=lambda: None,
            join=lambda policy, items, declared: status_of_part(
                policy, items, layout, NOW, declared
            ),
        )
    finally:
        store.close()
    assert policy is not None and len(policy.hosts) == 300
    assert revision > applied.revision
    assert sorted(h.host for h in hosts) == sorted(host_name(n) for n in range(300))
    seventh = next(h for h in hosts if h.host == host_name(7))
    assert [(g.gpu, g.holder) for g in seventh.gpus if g.holder is not None] == [("5", "late")]


def test_runs_and_pages_read_at_a_revision_hold_what_was_there_then(
    etcd_server: Any, prefix: str
) -> None:
    store = open_etcd(etcd_server.url)
    try:
        before = _write(store, prefix, 12)
        names = _names(prefix, 12)
        store.txn([], [Put(names[1], b"changed"), Delete(names[5]), Put(names[0] + "x", b"new")])
        runs = [[f"{prefix}/k000/", f"{prefix}/k001/"], [f"{prefix}/k005/", f"{prefix}/k007/"]]
        found = list(store.list_runs(runs, before.revision))
        pages = list(store.list_pages(prefix + "/", before.revision, 5))
    finally:
        store.close()
    old = {kv.key: kv for kv in before.items}
    # k006 lies between k005 and k007: read with the range, left out of the run.
    assert [list(listing.items) for listing in found] == [
        [old[names[0]], old[names[1]]],
        [old[names[5]], old[names[7]]],
    ]
    assert [len(page.items) for page in pages] == [5, 5, 2]
    assert tuple(kv for page in pages for kv in page.items) == before.items
