"""Contract: a holding written under a lease (`run`) goes with its lease, on every backend.

The holding's transaction mixes leased keys (the assignment, the job index
entry) with plain ones (generations, history); expiry removes exactly the
leased ones, a watch on the host sees the delete, and the GPUs can be
taken again.
"""

from __future__ import annotations

from pathlib import Path

from allocator.control.client import Allocator
from allocator.placement.choose import Request
from allocator.records.types import RunHolder
from allocator.store import Store
from tests.contract.test_lease import EXPIRY_DEADLINE_S, TTL_S, wait_until_gone
from tests.contract.test_watch import collect

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "policy.example.yaml"


def test_an_expired_holding_leaves_history_and_frees_its_gpus(store: Store, prefix: str) -> None:
    client = Allocator(store, prefix=prefix, actor="alice@h")
    client.apply_policy(EXAMPLE.read_text(), "policy.example.yaml")
    layout = client.layout
    lease = store.grant_lease(TTL_S)
    try:
        holder = RunHolder(pid=1, ttl=TTL_S)
        client.assign(Request(job="r", host="node1", gpus=(0, 1)), held_by=(holder, lease))
        written = store.get(layout.assignment("node1", "r"))
        assert written is not None and written.lease == lease
        watch = store.watch(layout.host_jobs("node1"), written.mod_revision + 1)
        try:
            assert wait_until_gone(store, layout.assignment("node1", "r"), EXPIRY_DEADLINE_S)
            events = collect(watch, 1)
        finally:
            watch.close()
        assert [(e.type, e.key) for e in events] == [("delete", layout.assignment("node1", "r"))]
        assert store.get(layout.job_index("r")) is None
        assert store.get(layout.host_generation("node1")) is not None
        assert store.list(layout.host_history("node1")).items  # the start entry stays
        taken, _ = client.assign(Request(job="b", host="node1", gpus=(0, 1)))
        assert taken.gpus == (0, 1)
    finally:
        store.revoke_lease(lease)
