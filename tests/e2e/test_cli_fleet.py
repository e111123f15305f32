"""`allocator status` on a fleet: a few range reads for every host, not one per host."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from allocator.control.client import Allocator
from allocator.records.keys import KeyLayout
from allocator.records.types import Assignment
from allocator.status.read import MAX_PARTS
from allocator.store import Put, open_store
from bench.fleet import fleet_policy
from tests.e2e.conftest import run_cli

HOSTS = 1000
GPUS = 8


@pytest.mark.parametrize(("policy", "ranges"), [(False, 1), (True, MAX_PARTS)])
def test_status_of_a_thousand_hosts_reads_a_few_ranges_not_one_per_host(
    etcd_server: Any, prefix: str, policy: bool, ranges: int
) -> None:
    # With the policy applied, the hosts are read as MAX_PARTS key ranges at once, cut
    # between the policy's hosts; without one, in one range. Either way a constant.
    layout = KeyLayout(prefix)
    store = open_store(etcd_server.url)
    try:
        if policy:
            Allocator(store, prefix=prefix, actor="ops@x").apply_policy(
                fleet_policy(HOSTS, GPUS), "fleet.yaml"
            )
        for first in range(0, HOSTS, 100):  # 100 hosts per transaction: etcd's txn limit is 128
            ops = []
            for n in range(first, first + 100):
                host = f"node{n:04d}"
                held = Assignment(
                    job="train",
                    host=host,
                    gpus=tuple(range(GPUS)),
                    mode="gpu",
                    updated_by="bench@x",
                    updated_at="2026-01-01T00:00:00Z",
                )
                ops.append(Put(layout.assignment(host, "train"), held.to_json()))
            store.txn([], ops)
    finally:
        store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}
    env.update(ALLOCATOR_STORE=etcd_server.url, ALLOCATOR_PREFIX=prefix)

    before = (etcd_server.requests_served("Range"), etcd_server.requests_served("Txn"))
    result = run_cli(["status", "-o", "json"], env)
    after = (etcd_server.requests_served("Range"), etcd_server.requests_served("Txn"))

    assert result.code == 0, result.err
    hosts = json.loads(result.out)["hosts"]
    assert len(hosts) == HOSTS
    assert sum(len(h["gpus"]) for h in hosts) == HOSTS * GPUS
    assert sum(g["holder"] == "train" for h in hosts for g in h["gpus"]) == HOSTS * GPUS
    # one batch (the policy and its compiled form) and the hosts' ranges
    assert (after[0] - before[0], after[1] - before[1]) == (ranges, 1)
