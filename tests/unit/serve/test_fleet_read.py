"""What ``allocator serve`` reads at start: only the keys it mirrors, in pages, at one revision."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.records.keys import KeyLayout
from allocator.serve import fleet_read
from allocator.store import open_store


@pytest.mark.parametrize("backend", ["etcd", "memory"])
def test_the_hosts_are_read_in_pages_at_the_policys_revision_and_nothing_else(
    backend: str, prefix: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "etcd":
        url = str(request.getfixturevalue("etcd_server").url)
    else:
        url = f"memory://{prefix.strip('/')}"
    monkeypatch.setattr(fleet_read, "PAGE_KEYS", 3)
    layout = KeyLayout(prefix)
    store = open_store(url)
    try:
        kept = {layout.policy, layout.queue_entry("n1", "000001")}
        kept |= {layout.assignment(f"n{n}", "train") for n in range(4)}
        kept |= {layout.agent(f"n{n}") for n in range(4)}
        for key in sorted(kept):
            store.put(key, b"{}")
        for other in (layout.job_index("train"), f"{layout.history}n1/000001"):
            store.put(other, b"{}")  # not read
        reads: list[Any] = []
        inner = getattr(store, "read_range", None)
        if inner is not None:
            monkeypatch.setattr(store, "read_range", lambda r: reads.append(r) or inner(r))
        listing = fleet_read.read_fleet(store, layout)
    finally:
        store.close()
    keys = [item.key for item in listing.items]
    assert sorted(keys) == sorted(kept) and len(keys) == len(set(keys))  # each once
    if backend == "etcd":
        assert len(reads) == 3  # 8 host keys, 3 a page
        assert {r["revision"] for r in reads} == {str(listing.revision)}
