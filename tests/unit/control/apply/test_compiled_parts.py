"""A one-host change to a fleet's policy rewrites only the compiled parts whose content changed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.errors import BadRecord, PlacementRefused, RequestError
from allocator.placement.choose import Request
from allocator.policy import load_policy
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.types import PolicyRecord
from allocator.status import applied_policy as applied_module
from allocator.status.applied_policy import applied_policy
from allocator.status.part_cache import PartCache
from allocator.store import Listing, Op, Put, Read, Store, open_store
from bench.bench_scale import ranged_policy

PREFIX = f"/fleet{uuid.uuid4().hex[:8]}"
LAYOUT = KeyLayout(PREFIX)
HOSTS = 12_500
#: What the issue allows a one-host change of a 12,500-host policy to write.
MOST_BYTES = 50_000


class _Writes:
    """A store that counts the bytes (keys and values) of every write sent through it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put(self, key: str, value: bytes, **kw: Any) -> int:
        self.bytes += len(key) + len(value)
        return self._store.put(key, value, **kw)

    def delete(self, key: str, **kw: Any) -> bool:
        self.bytes += len(key)
        return self._store.delete(key, **kw)

    def txn(self, compares: Sequence[Any], ops: Sequence[Op]) -> int:
        self.bytes += _op_bytes(ops)
        return self._store.txn(compares, ops)

    def txn_or_read(self, compares: Sequence[Any], ops: Sequence[Op], reads: Any) -> Any:
        outcome = self._store.txn_or_read(compares, ops, reads)
        self.bytes += _op_bytes(ops) if outcome.succeeded else 0
        return outcome


def _op_bytes(ops: Sequence[Op]) -> int:
    return sum(len(op.key) + (len(op.value) if isinstance(op, Put) else 0) for op in ops)


def _no_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_yaml(*_args: object, **_kw: object) -> None:
        raise AssertionError("the YAML was parsed")

    monkeypatch.setattr("allocator.policy.loader.load_policy", no_yaml)


@pytest.fixture(params=["memory", "sqlite", "etcd", "consul"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each backend, its per-transaction limits included."""
    if request.param == "memory":
        url = f"memory://{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'store.db'}"
    elif request.param == "etcd":
        url = request.getfixturevalue("etcd_server").url
    else:
        url = request.getfixturevalue("consul_url")
    opened = open_store(url, create=True)  # as `policy apply` opens it
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.slow
def test_a_one_host_change_at_12500_hosts_writes_only_what_changed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(applied_module, "PARTS", PartCache())  # kept parts of no other test
    whole, changed = ranged_policy(HOSTS), ranged_policy(HOSTS, exception_gpus=7)
    Allocator(store, prefix=PREFIX, actor="ops@h").apply_policy(whole, "p.yaml")
    old_record = store.get(LAYOUT.policy)
    old_compiled = store.get(LAYOUT.compiled_policy)
    assert old_record is not None and old_compiled is not None

    counted = _Writes(store)
    result = Allocator(counted, prefix=PREFIX, actor="ops@h").apply_policy(changed, "p.yaml")
    assert result.changed and result.compiled and result.shares
    print(f"bytes written by a one-host apply at {HOSTS:,} hosts: {counted.bytes}")
    assert counted.bytes <= MOST_BYTES

    bad: list[BadRecord] = []
    reader = Allocator(store, prefix=PREFIX, actor="ops@h", on_bad_record=bad.append)
    with monkeypatch.context() as patch:  # every reader sees the new policy, compiled
        _no_yaml(patch)
        assert reader.require_policy().policy == load_policy(changed)
        with pytest.raises((PlacementRefused, RequestError)):  # node0042 has 7 GPUs now
            reader.assign(Request(job="train", host="node0042", gpus=(7,)))
        reader.assign(Request(job="train", host="node0042", gpus=(6,)))

        # A reader that read the compiled record before the apply still joins its parts.
        record = decode_record(old_record.value, PolicyRecord, old_record.key)
        listing = Listing((old_compiled,), old_compiled.mod_revision)
        before = applied_policy(store, LAYOUT, record, bad.append, compiled=listing)
    assert before == load_policy(whole)
    assert bad == []


class _PartReads:
    """A store that counts the compiled parts' bytes read through it."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _count(self, listings: Sequence[Listing]) -> None:
        root = LAYOUT.compiled_parts_root
        items = [item for listing in listings for item in listing.items]
        self.bytes += sum(len(item.value) for item in items if item.key.startswith(root))

    def list(self, prefix: str, **kw: Any) -> Listing:
        listing = self._store.list(prefix, **kw)
        self._count([listing])
        return listing

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        found = self._store.read_many(reads)
        self._count(found)
        return found


def test_a_long_lived_reader_reads_only_the_parts_a_change_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(applied_module, "PARTS", PartCache())
    store = open_store(f"memory://{uuid.uuid4().hex}")
    whole, changed = ranged_policy(HOSTS), ranged_policy(HOSTS, exception_gpus=7)
    Allocator(store, prefix=PREFIX, actor="ops@h").apply_policy(whole, "p.yaml")
    reads = _PartReads(store)
    reader = Allocator(reads, prefix=PREFIX, actor="ops@h")
    assert reader.require_policy().policy == load_policy(whole)
    assert reads.bytes > 400_000  # every part, the first time

    Allocator(store, prefix=PREFIX, actor="ops@h").apply_policy(changed, "p.yaml")
    reads.bytes = 0
    assert reader.require_policy().policy == load_policy(changed)
    assert 0 < reads.bytes <= 40_000  # the part or two the change made


def test_cleanup_spares_what_a_later_apply_wrote_or_named() -> None:
    """An apply's cleanup deletes only parts older than its record, and nothing once another
    apply's record replaced its own: a later apply never names a part deleted under it."""
    from allocator.control.apply.compiled import drop_stale_parts

    store = open_store("memory://")
    layout = KeyLayout(f"/race{uuid.uuid4().hex[:8]}")
    old = store.put(layout.compiled_part("old"), b"o")
    ours = store.put(layout.compiled_policy, b"record of this apply")
    later = store.put(layout.compiled_part("later"), b"l")  # another apply's, after ours
    assert old < ours < later
    drop_stale_parts(store, layout, frozenset({"kept"}), ours, stored=True)
    keys = {i.key for i in store.list(layout.compiled_parts_root).items}
    assert keys == {layout.compiled_part("later")}

    store.put(layout.compiled_part("old"), b"o")
    store.put(layout.compiled_policy, b"record of a later apply")  # ours is replaced
    drop_stale_parts(store, layout, frozenset(), ours, stored=True)
    keys = {i.key for i in store.list(layout.compiled_parts_root).items}
    assert keys == {layout.compiled_part("later"), layout.compiled_part("old")}
