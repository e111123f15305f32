"""Assignments bound to a store lease: what their expiry leaves behind, and keeping the lease."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from allocator.cli.foreground import exit_status
from allocator.cli.run import split_command
from allocator.control.client import Allocator
from allocator.errors import ConflictError, LeaseLost, StoreUnavailable
from allocator.placement.choose import Request
from allocator.recipes.holding import LeaseKeeper, default_job_name, own_start_ticks
from allocator.records.types import RunHolder
from allocator.store import Store, open_store
from tests.support.waiting import wait_for

EXAMPLE = (Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml").read_text()
NOW = datetime(2026, 6, 1, tzinfo=UTC)
HOLDER = RunHolder(pid=4242, start_ticks=7, ttl=30.0)


@pytest.fixture
def store() -> Store:
    store = open_store(f"memory://{uuid.uuid4().hex}")
    Allocator(store, clock=lambda: NOW, actor="ops@h").apply_policy(EXAMPLE, "p.yaml")
    return store


def _client(store: Store) -> Allocator:
    return Allocator(store, clock=lambda: NOW, actor="alice@h")


def test_an_expired_lease_frees_the_gpus_even_for_a_client_that_kept_its_view(
    store: Store,
) -> None:
    alice = _client(store)
    alice.assign(Request(job="b", host="node1", gpus=(2,)))  # alice keeps b's view
    lease = store.grant_lease(30)
    alice.assign(Request(job="r", host="node1", gpus=(0, 1)), held_by=(HOLDER, lease))
    assert store.get(alice.layout.assignment("node1", "r")).lease == lease  # type: ignore[union-attr]
    assert store.get(alice.layout.job_index("r")).lease == lease  # type: ignore[union-attr]

    store.revoke_lease(lease)  # what expiry does: the keys go, no generation is bumped

    assert alice.find_job("r") == [] and store.get(alice.layout.job_index("r")) is None
    taken, _ = alice.assign(Request(job="b", host="node1", gpus=(0,)))  # not "held by job 'r'"
    assert taken.gpus == (0,)


def test_a_holding_is_refused_for_a_job_that_already_holds_gpus(store: Store) -> None:
    alice = _client(store)
    alice.assign(Request(job="train", host="node2", gpus=(0,)))
    lease = store.grant_lease(30)
    with pytest.raises(ConflictError, match="already holds"):
        alice.assign(Request(job="train", host="node1", gpus=(1,)), held_by=(HOLDER, lease))
    assert [a.host for a in alice.find_job("train")] == ["node2"]


def test_the_keeper_reports_a_lost_lease_once() -> None:
    lost: list[str] = []

    def refresh() -> None:
        raise LeaseLost("lease 7 has expired")

    keeper = LeaseKeeper(refresh, 0.15, lost.append)
    keeper.start()
    wait_for("the keeper to give up", lambda: lost, timeout=5)
    keeper.stop()
    assert lost == ["lease 7 has expired"]


def test_the_keeper_rides_out_an_unreachable_store_shorter_than_the_ttl() -> None:
    calls: list[int] = []
    lost: list[str] = []

    def refresh() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise StoreUnavailable("down")

    # Refresh often; the fixed clock says the TTL never passed.
    keeper = LeaseKeeper(refresh, 10.0, lost.append, monotonic=lambda: 0.0, every=0.05)
    keeper.start()
    wait_for("a refresh to succeed", lambda: len(calls) >= 4, timeout=5)
    keeper.stop()
    assert lost == []


def test_the_default_job_name_says_who_and_tells_runs_apart() -> None:
    assert default_job_name("alice", b"\x7f\x3a") == "run-alice-7f3a"
    assert default_job_name("Dr. Who!", b"\x00\x01") == "run-dr-who-0001"
    assert default_job_name("", b"\xff\xff") == "run-user-ffff"


def test_the_command_follows_the_double_dash_and_a_bare_wait_takes_no_word() -> None:
    assert split_command(["count=1", "--wait", "--", "python", "-o", "x"]) == (
        ["count=1", "--wait=forever"],
        ["python", "-o", "x"],
    )
    assert split_command(["count=1"]) == (["count=1"], [])


def test_exit_status_is_what_a_shell_reports() -> None:
    assert [exit_status(0), exit_status(7), exit_status(-9), exit_status(-2)] == [0, 7, 137, 130]


def test_own_start_ticks_reads_proc() -> None:
    ticks = own_start_ticks()
    assert ticks is None or ticks > 0
