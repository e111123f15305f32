"""The fleet's history index, end to end: real CLI processes on SQLite and a real etcd."""

from __future__ import annotations

from pathlib import Path

from allocator.control.across_hosts import MAX_JOB_HOSTS
from allocator.control.client import Allocator
from allocator.history import index as history_index
from allocator.placement.choose import Request
from allocator.records.keys import KeyLayout
from allocator.store import Delete, Store
from tests.e2e.conftest import Cli, history_entries


def test_limit_20_across_30_hosts_reads_the_index_and_falls_back_without_it(
    cli: Cli, store: Store, prefix: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nhosts:\n  node[01-30]: {gpus: 8}\n")
    assert cli("policy", "apply", str(policy)).code == 0
    # The real clock, as the CLI's: many entries share a second, ranked there by revision.
    allocator = Allocator(store, prefix=prefix, actor="alice@h")
    for round_ in range(3):
        for host in range(1, 31):
            allocator.assign(Request(job=f"job{host % 4}", host=f"node{host:02d}", gpus=(round_,)))
    hosts = ",".join(f"node{h:02d}" for h in range(1, MAX_JOB_HOSTS + 1))
    wide = cli("set", "job=wide", f"host={hosts}", "gpus=7")
    assert wide.code == 0, wide.err  # the widest job still fits one transaction with its pointer
    recent = history_index.recent_prefix(KeyLayout(prefix).history)

    everything = history_entries(cli)
    newest = history_entries(cli, "--limit", "20")

    assert len(everything) == 1 + 90 + MAX_JOB_HOSTS
    assert newest == everything[:20]
    assert {e["job"] for e in newest[:MAX_JOB_HOSTS]} == {"wide"}
    # One pointer an append, one for the whole job across hosts.
    assert len(store.list(recent).items) == 1 + 90 + 1

    store.txn([], [Delete(recent, prefix=True)])
    assert not store.list(recent).items
    assert history_entries(cli, "--limit", "20") == newest
