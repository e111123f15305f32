"""The usage report's read: under a policy only the hosts' jobs keys, never an agent's record."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.history.rollup import marker_key, marker_value
from allocator.placement.choose import Request
from allocator.status.usage_report import usage_report
from allocator.store import Listing, Store, open_store

POLICY = "version: 1\nhosts:\n  node1: {gpus: 8}\n  node2: {gpus: 8}\n  node3: {gpus: 8}\n"
NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


@pytest.fixture
def client(tmp_path: Path) -> Allocator:
    store = open_store(f"sqlite://{tmp_path / 'usage.db'}", create=True)
    client = Allocator(store, clock=lambda: NOW - timedelta(hours=2), actor="alice@h")
    client.apply_policy(POLICY, "p.yaml")
    client.assign(Request(job="train", host="node1", count=2))
    client.assign(Request(job="eval", host="node3", count=1))
    # A busy host's bulk: its agent's record; here damaged, which usage must not even read.
    store.put(client.layout.agent("node2"), b"{not json")
    return client


def _watched(store: Store) -> list[str]:
    """Every prefix ``store`` is asked to list, whole or in runs, from now on."""
    asked: list[str] = []
    whole, runs = store.list, store.list_runs

    def listed(prefix: str, **kwargs: object) -> Listing:
        asked.append(prefix)
        return whole(prefix, **kwargs)  # type: ignore[arg-type]

    def ran(chunks: Sequence[Sequence[str]], revision: int) -> Iterator[Listing]:
        asked.extend(p for chunk in chunks for p in chunk)
        return runs(chunks, revision)

    store.list, store.list_runs = listed, ran  # type: ignore[method-assign,assignment]
    return asked


def test_with_a_rollup_only_the_policys_hosts_jobs_keys_are_read(client: Allocator) -> None:
    layout = client.layout
    client.store.put(marker_key(layout.history), marker_value(NOW))
    asked = _watched(client.store)

    document, _rows = usage_report(client, NOW - timedelta(days=1), "job", NOW)

    hosts_read = [p for p in asked if p.startswith(layout.hosts)]
    # Each host's jobs, and the first once more (a small read naming the store's revision).
    assert sorted(set(hosts_read)) == [layout.host_jobs(h) for h in ("node1", "node2", "node3")]
    assert len(hosts_read) == 4
    assert document["source"] == "rollup"
    hours = {row["key"]: row["gpu_hours"] for row in document["rows"]}
    assert hours == pytest.approx({"train": 4.0, "eval": 2.0}, abs=0.01)


def test_without_a_rollup_history_counts_the_same(client: Allocator) -> None:
    document, _rows = usage_report(client, NOW - timedelta(days=1), "job", NOW)

    assert document["source"] == "history"
    hours = {row["key"]: row["gpu_hours"] for row in document["rows"]}
    assert hours == pytest.approx({"train": 4.0, "eval": 2.0}, abs=0.01)
