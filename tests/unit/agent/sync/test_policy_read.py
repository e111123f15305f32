"""The agent's read of its share of the policy: a value is fetched only when its revision moved."""

from __future__ import annotations

import uuid
from typing import Any

from allocator.agent.sync.policy_read import PolicyReader, SharedPolicy
from allocator.control.client import Allocator
from allocator.records.keys import KeyLayout
from allocator.store import KeyValue, Store, open_store

PREFIX = "/agent-read"
LAYOUT = KeyLayout(PREFIX)
HOST = "n003"


def _policy(gpus: int = 8, other: int = 8) -> str:
    return (
        "version: 1\nhosts:\n  'n[000-099]': {gpus: 8}\n"
        f"  n003: {{gpus: {gpus}}}\n  n050: {{gpus: {other}}}\n"
        "jobs:\n  train: {command: [x]}\n"
    )


class _Gets:
    """A store that counts the values fetched one key at a time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.gets: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, key: str) -> KeyValue | None:
        self.gets.append(key)
        return self._store.get(key)


def _world() -> tuple[Store, Allocator, _Gets]:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    return store, Allocator(store, prefix=PREFIX, actor="ops@h"), _Gets(store)


def test_a_resync_of_an_unchanged_policy_fetches_no_value() -> None:
    _, allocator, counting = _world()
    allocator.apply_policy(_policy(), "p.yaml")
    reader = PolicyReader(LAYOUT, HOST)
    _, first = reader.read(counting)
    assert isinstance(first.policy, SharedPolicy) and not first.whole
    assert sorted(counting.gets) == sorted([LAYOUT.common_share, LAYOUT.host_share(HOST)])

    counting.gets.clear()
    _, again = reader.read(counting)
    assert counting.gets == [] and again.policy == first.policy

    allocator.apply_policy(_policy(other=4), "p.yaml")  # another host's entry
    reader.read(counting)
    assert counting.gets == []

    allocator.apply_policy(_policy(gpus=4, other=4), "p.yaml")  # this host's
    _, mine = reader.read(counting)
    assert counting.gets == [LAYOUT.host_share(HOST)]
    assert isinstance(mine.policy, SharedPolicy) and mine.policy.part is not None
    assert mine.policy.part.host is not None and mine.policy.part.host.gpus == 4


def test_without_shares_or_behind_the_policy_the_whole_record_is_read() -> None:
    store, allocator, counting = _world()
    allocator.apply_policy(_policy(), "p.yaml")
    store.put(LAYOUT.policy, store.get(LAYOUT.policy).value)  # type: ignore[union-attr]
    _, behind = PolicyReader(LAYOUT, HOST).read(counting)
    assert behind.whole and counting.gets == [LAYOUT.policy]

    for item in store.list(LAYOUT.shares).items:
        store.delete(item.key)
    _, none = PolicyReader(LAYOUT, HOST).read(counting)
    assert none.whole and none.present and not isinstance(none.policy, SharedPolicy)


def test_a_host_without_a_share_is_named_only_by_a_policy_naming_no_host() -> None:
    _, allocator, counting = _world()
    allocator.apply_policy(_policy(), "p.yaml")
    _, outside = PolicyReader(LAYOUT, "elsewhere").read(counting)
    assert isinstance(outside.policy, SharedPolicy) and not outside.policy.host_named
    _, inside = PolicyReader(LAYOUT, HOST).read(counting)
    assert isinstance(inside.policy, SharedPolicy) and inside.policy.host_named

    allocator.apply_policy("version: 1\njobs:\n  train: {command: [x]}\n", "p.yaml", force=True)
    _, anywhere = PolicyReader(LAYOUT, "elsewhere").read(counting)
    assert isinstance(anywhere.policy, SharedPolicy) and anywhere.policy.host_named
