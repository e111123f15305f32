"""`allocator status` on a fleet: one range read for every host, not one per host."""

from __future__ import annotations

import json
import os
from typing import Any

from allocator.keys import KeyLayout
from allocator.records import Assignment
from allocator.store import Put, open_store
from tests.e2e.conftest import run_cli

HOSTS = 1000
GPUS = 8


def test_status_of_a_thousand_hosts_is_one_range_read(etcd_server: Any, prefix: str) -> None:
    layout = KeyLayout(prefix)
    store = open_store(etcd_server.url)
    try:
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

    before = etcd_server.requests_served("Range")
    result = run_cli(["status", "-o", "json"], env)
    reads = etcd_server.requests_served("Range") - before

    assert result.code == 0, result.err
    hosts = json.loads(result.out)["hosts"]
    assert len(hosts) == HOSTS
    assert sum(len(h["gpus"]) for h in hosts) == HOSTS * GPUS
    assert reads == 2  # the applied policy (a get) and every host (one prefix range)
