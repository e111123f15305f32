"""Idle releases as the store link carries them out: only the judged assignment goes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.planning.types import IdleRelease
from allocator.agent.sync.idle_releaser import IdleReleaser
from allocator.control.client import Allocator
from allocator.errors import PermissionDenied
from allocator.placement.choose import Request
from allocator.records.keys import KeyLayout
from allocator.store import Compare, Op, Store, open_store

EXAMPLE = (Path(__file__).resolve().parents[4] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)
REASON = "idle for 2h03m (policy idle rule on pool a100)"


class World:
    def __init__(self, store: Any) -> None:
        self.store = store
        self.operator = Allocator(store, clock=lambda: NOW, actor="alice@h")
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.releaser = IdleReleaser(KeyLayout(), "node1", lambda e, f: self.events.append((e, f)))

    def set_train(self, gpus: tuple[int, ...] = (1,)) -> int:
        self.operator.assign(Request(job="train", host="node1", gpus=gpus))
        item = self.store.get(KeyLayout().assignment("node1", "train"))
        assert item is not None
        return int(item.mod_revision)

    def holds(self) -> tuple[int, ...] | None:
        found = self.operator.host("node1").assignments.get("train")
        return found.gpus if found else None

    def release(self, revision: int) -> str:
        assert self.releaser.offer([IdleRelease("train", revision, REASON)])
        self.releaser.run(self.store)
        return self.events[-1][0]


@pytest.fixture
def world() -> World:
    w = World(open_store(f"memory://{uuid.uuid4().hex}"))
    w.operator.apply_policy(EXAMPLE, "p.yaml")
    return w


def test_the_judged_assignment_is_released_with_its_reason(world: World) -> None:
    revision = world.set_train()
    assert world.release(revision) == "idle-released"
    assert world.holds() is None
    assert world.events[-1][1]["reason"] == REASON


def test_an_assignment_set_again_since_it_was_judged_is_left_alone(world: World) -> None:
    judged = world.set_train((1,))
    world.set_train((2,))  # the operator moved it meanwhile
    assert world.release(judged) == "idle-release-overtaken"
    assert world.holds() == (2,)


def test_an_operators_set_racing_the_release_wins(world: World) -> None:
    judged = world.set_train((1,))

    class Racing:
        """The operator's `set` lands between the releaser's checks and its transaction."""

        def __init__(self, store: Store) -> None:
            self._store, self.raced = store, False

        def __getattr__(self, name: str) -> object:
            return getattr(self._store, name)

        def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
            if not self.raced:
                self.raced = True
                world.set_train((2,))
            return self._store.txn(compares, ops)

    world.releaser.offer([IdleRelease("train", judged, REASON)])
    world.releaser.run(Racing(world.store))  # type: ignore[arg-type]
    assert world.events[-1][0] == "idle-release-conflict"
    assert world.holds() == (2,)


def test_a_refused_permission_is_logged_not_raised_and_not_retried(world: World) -> None:
    judged = world.set_train()

    class ReadOnly:
        def __init__(self, store: Store) -> None:
            self._store = store

        def __getattr__(self, name: str) -> object:
            return getattr(self._store, name)

        def txn(self, compares: Sequence[Compare], ops: Sequence[Op]) -> int:
            raise PermissionDenied("etcd: permission denied")

    world.releaser.offer([IdleRelease("train", judged, REASON)])
    world.releaser.run(ReadOnly(world.store))  # type: ignore[arg-type]
    assert world.events[-1][0] == "idle-release-refused"
    assert world.holds() == (1,)
    assert not world.releaser.offer([IdleRelease("train", judged, REASON)])  # not again


def test_the_same_release_offered_on_every_sample_is_done_once(world: World) -> None:
    judged = world.set_train()
    release = IdleRelease("train", judged, REASON)
    assert world.releaser.offer([release])
    assert not world.releaser.offer([release])
    world.releaser.run(world.store)
    assert not world.releaser.offer([release])
    assert [e for e, _ in world.events] == ["idle-released"]


def test_the_agent_releases_whoever_holds_the_idle_assignment(world: World) -> None:
    world.operator = Allocator(world.store, clock=lambda: NOW, actor="x@h", holder="someone-else")
    judged = world.set_train()
    assert world.operator.host("node1").assignments["train"].holder == "someone-else"
    assert world.release(judged) == "idle-released"  # the policy's rule, not a user's release
    assert world.holds() is None
