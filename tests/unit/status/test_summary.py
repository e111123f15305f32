"""status --summary: totals per pool from the joined status."""

from __future__ import annotations

from allocator.agent.sync.reports import host_counts
from allocator.cli.output import render_table
from allocator.errors import BadRecord
from allocator.records.host_counts import HostCounts
from allocator.records.types import AgentRecord, Assignment
from allocator.status.filters import pool_by_host
from allocator.status.join import build_status
from allocator.status.summary import (
    COUNTS,
    PoolSummary,
    summarize,
    summary_document,
    summary_table,
)
from allocator.status.summary_count import count_part, reported_counts, summary_of_counts
from allocator.store import KeyValue
from tests.unit.status.test_filters import LAYOUT, NOW, POLICY, _fleet


def test_each_pool_gets_its_counts_and_a_total() -> None:
    hosts = build_status(POLICY, _fleet(), LAYOUT, NOW)
    summary = summarize(hosts, pool_by_host(POLICY), {"n2": 3, "elsewhere": 5}, revision=9)
    document = summary_document(summary)
    a100, h100 = document["pools"]
    assert a100 == {
        "pool": "a100",
        "hosts": 2,
        "gpus": 6,
        "free": 2,
        "held": 3,
        "idle": 1,
        "unhealthy": 1,
        "fallback": 1,
        "reserved": 1,
        "queued": 3,
        "agents_down": 1,  # n2 has no agent key and no worker without one: "none"
    }
    assert h100["pool"] == "h100" and h100["gpus"] == 2 and h100["free"] == 2
    assert h100["fallback"] == 1  # the job the fallback put on CPU
    total = document["total"]
    assert total["pool"] is None and total["hosts"] == 3 and total["gpus"] == 8
    assert total["queued"] == 3 and document["revision"] == 9


def test_hosts_of_no_pool_come_last_and_the_table_has_a_total_row() -> None:
    hosts = build_status(POLICY, _fleet(), LAYOUT, NOW)
    summary = summarize(hosts, {"n1": "a100"})
    assert [row.pool for row in summary.pools] == ["a100", None]
    lines = summary_table(summary, render_table).splitlines()
    assert lines[0].split()[:3] == ["POOL", "HOSTS", "GPUS"]
    assert lines[2].split()[0] == "-" and lines[-1].split()[:3] == ["TOTAL", "3", "8"]


def test_nothing_to_count_is_a_total_of_zeros() -> None:
    document = summary_document(summarize([], {}))
    assert document["pools"] == [] and document["total"]["gpus"] == 0


def test_counting_from_the_keys_gives_the_join_s_counts() -> None:
    pools = pool_by_host(POLICY)
    queued = {"n1": 2}
    joined = summarize(build_status(POLICY, _fleet(), LAYOUT, NOW), pools, queued, 4)
    counted = summary_of_counts(
        count_part(POLICY, _fleet(), LAYOUT, NOW, POLICY.hosts, pools), queued, 4
    )
    assert summary_document(counted) == summary_document(joined)


def test_counting_parts_one_by_one_is_counting_the_whole() -> None:
    pools = pool_by_host(POLICY)
    items = _fleet()
    first = [i for i in items if "/m1/" in i.key]
    rest = [i for i in items if "/m1/" not in i.key]
    parts = count_part(POLICY, first, LAYOUT, NOW, ["m1"], pools) + count_part(
        POLICY, rest, LAYOUT, NOW, ["n1", "n2"], pools
    )
    whole = count_part(POLICY, items, LAYOUT, NOW, POLICY.hosts, pools)
    assert summary_document(summary_of_counts(parts)) == summary_document(summary_of_counts(whole))


def _agent_counts(host: str) -> KeyValue:
    """The counts ``host``'s agent would write for :func:`_fleet`'s records (lease 7)."""
    items = [i for i in _fleet() if i.key.startswith(LAYOUT.host(host))]
    agent = next(AgentRecord.from_json(i.value) for i in items if i.key == LAYOUT.agent(host))
    workers = {i.key.rsplit("/", 1)[1]: i.value for i in items if "/workers/" in i.key}
    held = {
        i.key.rsplit("/", 1)[1]: Assignment.from_json(i.value) for i in items if "/jobs/" in i.key
    }
    raw = host_counts(agent, workers, held)
    assert raw is not None
    return KeyValue(LAYOUT.host_counts(host), raw, 1, 1, 7)


def test_an_agent_counts_its_host_as_the_summary_counts_its_records() -> None:
    pools = pool_by_host(POLICY)
    n1 = [i for i in _fleet() if i.key.startswith(LAYOUT.host("n1"))]
    from_records = count_part(POLICY, n1, LAYOUT, NOW, ["n1"], pools)
    reported = reported_counts(POLICY, [_agent_counts("n1")], LAYOUT, NOW, pools, _refuse)
    assert list(reported.values()) == from_records
    assert from_records[0].counts.reserved == 1 and from_records[0].counts.idle == 1


def test_counts_not_an_agent_s_or_not_this_host_s_are_not_used() -> None:
    good = _agent_counts("n1")
    bad: list[BadRecord] = []
    items = [
        KeyValue(LAYOUT.host_counts("n2"), HostCounts("n2", (0, 1)).to_json(), 1, 1, None),
        KeyValue(LAYOUT.host_counts("m1"), good.value, 1, 1, 7),  # names n1
        KeyValue(LAYOUT.host_counts("n9"), b'{"host": "n9", "gpus": "x"}', 1, 1, 7),
        KeyValue(LAYOUT.host_counts("n8"), HostCounts("n8").to_json(), 1, 1, 7),  # no GPUs
    ]
    # n2's is not leased (written by hand), m1's names n1, n9's does not decode, n8 has no GPUs.
    assert reported_counts(POLICY, items, LAYOUT, NOW, {}, bad.append) == {}
    assert [error.key for error in bad] == [LAYOUT.host_counts("n9")]


def _refuse(error: BadRecord) -> None:
    raise AssertionError(error)


def test_adding_rows_adds_every_counted_column() -> None:
    row = PoolSummary("a")
    row.add(PoolSummary("a", **dict.fromkeys(COUNTS, 1)))
    row.add(PoolSummary("a", **dict.fromkeys(COUNTS, 2)))
    assert {name: getattr(row, name) for name in COUNTS} == dict.fromkeys(COUNTS, 3)
