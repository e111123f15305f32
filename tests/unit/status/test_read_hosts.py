"""The key ranges a filtered status reads: runs of hosts next to each other in key order."""

from __future__ import annotations

from pathlib import Path

from allocator.records.keys import KeyLayout
from allocator.status.read_hosts import host_runs, picked_items, read_picked
from allocator.store import KeyValue, open_store

LAYOUT = KeyLayout("/a")
FLEET = [f"node{i:04d}" for i in range(1000)]


def test_hosts_next_to_each_other_are_one_range() -> None:
    picked = FLEET[100:200]
    assert host_runs(LAYOUT, picked, FLEET) == [picked]


def test_hosts_apart_are_ranges_of_their_own_in_key_order() -> None:
    runs = host_runs(LAYOUT, ["node0500", "node0001", "node0002", "zz"], FLEET)
    assert runs == [["node0001", "node0002"], ["node0500"], ["zz"]]


def test_too_many_ranges_are_merged_across_the_smallest_gaps() -> None:
    every_other = [*FLEET[0:100:2], "node0900"]
    runs = host_runs(LAYOUT, every_other, FLEET, max_ranges=2)
    assert runs == [FLEET[0:100:2], ["node0900"]]


def test_a_long_run_is_cut_into_ranges_of_at_most_per_range_hosts() -> None:
    runs = host_runs(LAYOUT, FLEET, FLEET, per_range=300)
    assert [len(run) for run in runs] == [300, 300, 300, 100]


def test_a_range_s_keys_of_hosts_not_picked_are_left_out() -> None:
    items = [KeyValue(LAYOUT.agent(h), b"{}", 1, 1) for h in ("node0001", "node0002", "node0003")]
    kept = picked_items(LAYOUT, items, {"node0001", "node0003"})
    assert [item.key for item in kept] == [LAYOUT.agent("node0001"), LAYOUT.agent("node0003")]


def test_a_store_without_ranges_reads_each_picked_host_in_batches(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path / 'store.db'}")
    try:
        hosts = FLEET[:150]
        for host in hosts:
            store.put(LAYOUT.agent(host), b"{}")
        store.put(LAYOUT.agent("zz"), b"{}")
        picked = [*hosts[:140], "zz"]  # more than one batch of MAX_TXN_OPS reads
        runs = host_runs(LAYOUT, picked, FLEET)
        listings = list(read_picked(store, LAYOUT, runs, 0))
    finally:
        store.close()
    assert [len(listing.items) for listing in listings] == [140, 1]
    assert listings[0].items[-1].key == LAYOUT.agent("node0139")
