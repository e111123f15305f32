"""``policy apply`` writes the policy's shares: every one the first time, then only what changed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from allocator.control.apply import compiled as compiled_policy
from allocator.control.client import Allocator
from allocator.errors import RequestError
from allocator.placement.choose import Request
from allocator.policy.shares import decode_host_part
from allocator.records.codec import decode_record
from allocator.records.keys import KeyLayout
from allocator.records.shares import SharesHead
from allocator.status.read import read_status
from allocator.store import KeyValue, Listing, Read, Store, open_store

PREFIX = "/shares"
LAYOUT = KeyLayout(PREFIX)


def _policy(hosts: int, *, extra: str = "") -> str:
    return (
        "version: 1\n"
        f"hosts:\n  'n[000-{hosts - 1:03d}]': {{gpus: 8}}\n{extra}"
        "jobs:\n  train: {command: [x]}\n"
    )


def _world() -> tuple[Store, Allocator]:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    return store, Allocator(store, prefix=PREFIX, actor="ops@h")


def _revisions(store: Store) -> dict[str, int]:
    return {item.key: item.mod_revision for item in store.list(LAYOUT.shares).items}


def test_a_first_apply_writes_every_hosts_share_in_batches_then_only_what_changes() -> None:
    store, allocator = _world()
    first = allocator.apply_policy(_policy(200), "p.yaml")
    shares = _revisions(store)
    assert {LAYOUT.common_share, LAYOUT.shares_head, LAYOUT.host_share("n199")} <= shares.keys()
    assert len([k for k in shares if k.startswith(LAYOUT.host_shares)]) == 200
    # The common share and the head travel in the apply's transaction, the hosts' before it.
    assert shares[LAYOUT.common_share] == shares[LAYOUT.shares_head] == first.revision
    assert shares[LAYOUT.host_share("n000")] < first.revision
    head = store.get(LAYOUT.shares_head)
    assert (
        head is not None
        and decode_record(head.value, SharesHead).policy_sha256 == first.record.sha256
    )

    changed = _policy(200, extra="  n007: {gpus: 4}\n")
    second = allocator.apply_policy(changed, "p.yaml")
    after = _revisions(store)
    moved = {key for key in after if after[key] != shares.get(key)}
    assert moved == {LAYOUT.host_share("n007"), LAYOUT.shares_head}
    item = store.get(LAYOUT.host_share("n007"))
    assert item is not None and item.mod_revision == second.revision  # in the apply's txn
    decoded = decode_host_part(item.value, item.key, "n007")
    assert decoded is not None and decoded[1].host is not None and decoded[1].host.gpus == 4


def test_the_shares_of_hosts_that_left_are_deleted() -> None:
    store, allocator = _world()
    allocator.apply_policy(_policy(100), "p.yaml")
    allocator.apply_policy(_policy(90), "p.yaml")
    hosts = [k for k in _revisions(store) if k.startswith(LAYOUT.host_shares)]
    assert len(hosts) == 90 and LAYOUT.host_share("n095") not in hosts


def test_an_apply_that_stopped_half_way_makes_the_next_one_write_every_share() -> None:
    store, allocator = _world()
    allocator.apply_policy(_policy(100), "p.yaml")
    store.put(LAYOUT.shares_head, SharesHead("").to_json())  # what a stopped apply leaves
    store.put(LAYOUT.host_share("n001"), b"what it had half written")
    before = _revisions(store)
    allocator.apply_policy(_policy(100, extra="  n007: {gpus: 4}\n"), "p.yaml")
    after = _revisions(store)
    assert all(after[key] != before[key] for key in after if key.startswith(LAYOUT.host_shares))
    item = store.get(LAYOUT.host_share("n001"))
    assert item is not None and decode_host_part(item.value, item.key, "n001") is not None


def test_re_applying_the_same_file_writes_the_shares_an_older_version_did_not() -> None:
    store, allocator = _world()
    allocator.apply_policy(_policy(10), "p.yaml")
    for key in _revisions(store):  # a policy applied by a version without shares
        store.delete(key)
    result = allocator.apply_policy(_policy(10), "p.yaml")
    assert not result.changed
    assert len(_revisions(store)) == 10 + 2


class _Reads:
    """A store that records every key it returns (to see what a command read)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.keys: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, key: str) -> KeyValue | None:
        item = self._store.get(key)
        self.keys += [item.key] if item else []
        return item

    def list(self, prefix: str, **kw: Any) -> Listing:
        listing = self._store.list(prefix, **kw)
        self.keys += [item.key for item in listing.items]
        return listing

    def read_many(self, reads: Sequence[Read]) -> tuple[Listing, ...]:
        found = self._store.read_many(reads)
        self.keys += [item.key for listing in found for item in listing.items]
        return found

    def txn_or_read(self, *args: Any) -> Any:
        return self._store.txn_or_read(*args)


@pytest.fixture
def in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled policy stored in parts, as a fleet's is (its budget made tiny)."""
    monkeypatch.setattr(compiled_policy, "TXN_VALUE_BUDGET", 4096)


def test_set_and_status_on_one_host_read_its_share_not_the_compiled_policy(
    in_parts: None,
) -> None:
    store, allocator = _world()
    allocator.apply_policy(_policy(200), "p.yaml")
    assert store.list(LAYOUT.compiled_parts_root).items  # the fleet's compiled policy is in parts
    reads = _Reads(store)
    client = Allocator(reads, prefix=PREFIX, actor="ops@h")
    client.assign(Request(job="train", host="n007", gpus=(1,)))
    status, _, _ = read_status(
        client,
        LAYOUT.host("n007"),
        only_host="n007",
        while_reading=lambda: None,
        join=lambda policy, items, hosts: [],
    )
    assert set(status.hosts) == {"n007"}
    assert not [key for key in reads.keys if key.startswith(LAYOUT.compiled_parts_root)]
    assert {LAYOUT.host_share("n007"), LAYOUT.common_share} <= set(reads.keys)

    # Another host next is decided from its own share, not the one kept for n007.
    client.assign(Request(job="train", host="n008", gpus=(2,)))
    held = {a.host: a.gpus for a in client.find_job("train")}
    assert held == {"n007": (1,), "n008": (2,)}


def test_a_host_without_a_share_is_refused_naming_the_policys_hosts(in_parts: None) -> None:
    _, allocator = _world()
    allocator.apply_policy(_policy(20), "p.yaml")
    with pytest.raises(RequestError, match=r"not in the policy \(hosts: n000, n001"):
        allocator.assign(Request(job="train", host="elsewhere", gpus=(1,)))
