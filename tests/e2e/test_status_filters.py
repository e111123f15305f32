"""``allocator status`` filters (host=, pool=, job=, state=) and ``--summary``, on each store."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from allocator.control.apply import compiled as compiled_policy
from allocator.control.client import Allocator
from allocator.records.host_counts import HostCounts
from allocator.records.keys import KeyLayout
from allocator.store import Store, open_store
from bench.fleet import fleet_policy, host_name
from tests.e2e.conftest import Cli, Result, clean_env, run_cli
from tests.support.etcd_server import EtcdServer

POLICY = """\
version: 1
hosts:
  node[01-12]: {gpus: 2, pool: a}
  gpu-1: {gpus: 4, pool: b}
  other: {gpus: 1}
pools:
  a: {sharing: exclusive}
  b: {sharing: exclusive}
jobs:
  train:
    command: [python, -m, train]
"""


def _write_fleet(cli: Cli, policy: Path) -> Cli:
    """Fifteen hosts in two pools (and one in none), three jobs holding GPUs."""
    policy.write_text(POLICY)
    assert cli("policy", "apply", str(policy)).code == 0
    for job, host, gpus in (
        ("train", "node03", "0"),
        ("eval", "node10", "1"),
        ("infer", "gpu-1", "0,1"),
    ):
        result = cli("set", f"job={job}", f"gpus={gpus}", f"host={host}")
        assert result.code == 0, result.err
    return cli


@pytest.fixture(scope="module", params=["sqlite", "etcd"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The fleet, written once per store for the tests that only read it.

    Tests that write (a new job, say) take ``own_fleet`` instead.
    """
    tmp = tmp_path_factory.mktemp("fleet")
    if request.param == "sqlite":
        url = f"sqlite://{tmp / 'store.db'}"
    else:
        url = str(request.getfixturevalue("etcd_server").url)
    env = clean_env(ALLOCATOR_STORE=url, ALLOCATOR_PREFIX=f"/t-{uuid.uuid4().hex[:12]}")

    def call(*args: str) -> Result:
        return run_cli(args, env)

    return _write_fleet(call, tmp / "policy.yaml")


@pytest.fixture
def own_fleet(cli: Cli, tmp_path: Path) -> Cli:
    """The fleet, written for this test alone."""
    return _write_fleet(cli, tmp_path / "policy.yaml")


def _json(cli: Cli, *words: str) -> dict:  # type: ignore[type-arg]
    result = cli("status", *words, "-o", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)  # type: ignore[no-any-return]


def _gpus(document: dict) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {h["host"]: [g["gpu"] for g in h["gpus"]] for h in document["hosts"]}


def test_host_patterns_pick_names_globs_and_ranges(fleet: Cli) -> None:
    assert list(_gpus(_json(fleet, "host=node[02-04]"))) == ["node02", "node03", "node04"]
    assert list(_gpus(_json(fleet, "host=node1*"))) == ["node10", "node11", "node12"]
    assert list(_gpus(_json(fleet, "host=other,gpu-1"))) == ["gpu-1", "other"]
    table = fleet("status", "host=node[03-04]")
    assert table.code == 0, table.err
    rows = [line.split()[:3] for line in table.out.splitlines()[1:5]]
    assert rows == [
        ["node03", "0", "train"],
        ["node03", "1", "-"],
        ["node04", "0", "-"],
        ["node04", "1", "-"],
    ]


def test_pool_job_and_state_filters_combine(fleet: Cli) -> None:
    assert list(_gpus(_json(fleet, "pool=b"))) == ["gpu-1"]
    assert len(_gpus(_json(fleet, "pool=a,b"))) == 13
    assert _gpus(_json(fleet, "pool=b", "state=free")) == {"gpu-1": ["2", "3"]}
    held = _json(fleet, "state=held")
    assert _gpus(held) == {"gpu-1": ["0", "1"], "node03": ["0"], "node10": ["1"]}
    train = _json(fleet, "job=train")
    assert _gpus(train) == {"node03": ["0"]}
    assert [j["job"] for j in train["hosts"][0]["jobs"]] == ["train"]
    assert _gpus(_json(fleet, "job=eval,infer", "host=node*")) == {"node10": ["1"]}


def test_a_filter_matching_nothing_prints_the_header_alone(fleet: Cli) -> None:
    assert _json(fleet, "job=ghost")["hosts"] == []
    assert _json(fleet, "host=zz[1-3]")["hosts"] == []
    table = fleet("status", "pool=b", "state=unhealthy")
    assert table.code == 0, table.err
    assert table.out.split() == [
        "HOST",
        "GPU",
        "JOB",
        "USER",
        "SLOTS",
        "SINCE",
        "REASON",
        "HEALTH",
        "RESERVED",
        "IDLE",
    ]


def test_a_bad_filter_is_exit_2_one_line_and_nothing_printed(fleet: Cli) -> None:
    for word, said in (
        ("state=busy", "state=busy: not a GPU state"),
        ("host=node[9-1]", "runs backwards"),
        ("pool=nope", "pool=nope: no such pool"),
        ("job=a/b", "job=a/b"),
    ):
        result = fleet("status", word, "-o", "json")
        assert result.code == 2, (word, result.err)
        assert result.out == ""
        (line,) = result.err.strip().splitlines()
        assert said in line


def test_summary_counts_each_pool_and_the_total(fleet: Cli) -> None:
    document = _json(fleet, "--summary")
    pools = {row["pool"]: row for row in document["pools"]}
    assert list(pools) == ["a", "b", None]
    assert pools["a"]["hosts"] == 12 and pools["a"]["gpus"] == 24
    assert pools["a"]["held"] == 2 and pools["a"]["free"] == 22
    assert pools["b"]["held"] == 2 and pools["b"]["free"] == 2
    assert pools[None]["gpus"] == 1 and pools["a"]["agents_down"] == 12
    total = document["total"]
    assert total["hosts"] == 14 and total["gpus"] == 29 and total["held"] == 4
    assert isinstance(document["revision"], int)
    filtered = _json(fleet, "--summary", "pool=b")
    assert [row["pool"] for row in filtered["pools"]] == ["b"]
    table = fleet("status", "--summary")
    assert table.code == 0, table.err
    lines = [line.split() for line in table.out.splitlines()]
    assert lines[0][:4] == ["POOL", "HOSTS", "GPUS", "FREE"]
    assert lines[1][:4] == ["a", "12", "24", "22"] and lines[-1][:3] == ["TOTAL", "14", "29"]


def _ranges_read(server: EtcdServer, args: list[str], env: dict[str, str]) -> tuple[int, Result]:
    before = server.requests_served("Range")
    result = run_cli(args, env)
    return server.requests_served("Range") - before, result


def test_reads_cost_what_they_pick_and_a_fleet_in_parts_is_read_in_parts(
    etcd_server_private: EtcdServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A compiled policy too large to sit next to its record (a fleet past ~5,900
    # hosts) is stored in parts: status must still cut the hosts' read into parts.
    monkeypatch.setattr(compiled_policy, "TXN_VALUE_BUDGET", 8 * 1024)
    server = etcd_server_private
    store = open_store(server.url)
    try:
        layout = KeyLayout(prefix)
        Allocator(store, prefix=prefix, actor="t@x").apply_policy(fleet_policy(300), "f.yaml")
        assert store.list(layout.compiled_parts_root).items  # the policy is in parts
    finally:
        store.close()
    env = clean_env(ALLOCATOR_STORE=server.url, ALLOCATOR_PREFIX=prefix)
    # one batch (a txn), the compiled parts (one range), then the hosts: 3 parts
    whole, result = _ranges_read(server, ["status", "-o", "json"], env)
    assert result.code == 0, result.err
    assert len(json.loads(result.out)["hosts"]) == 300
    assert whole == 1 + 3
    # host= a range of ten hosts: one range of theirs, whatever the fleet's size
    some, result = _ranges_read(server, ["status", "host=node[0100-0109]", "-o", "json"], env)
    assert result.code == 0, result.err
    assert [h["host"] for h in json.loads(result.out)["hosts"]] == [
        host_name(n) for n in range(100, 110)
    ]
    assert some == 1 + 1


def test_a_job_across_hosts_is_listed_whole_under_job_and_not_under_pool(own_fleet: Cli) -> None:
    fleet = own_fleet
    result = fleet("set", "job=dist", "count=1", "host=node05,node06")
    assert result.code == 0, result.err
    across = _json(fleet, "job=dist")
    assert list(_gpus(across)) == ["node05", "node06"]
    (group,) = across["jobs_across_hosts"]
    assert group["job"] == "dist" and [s["host"] for s in group["shares"]] == ["node05", "node06"]
    assert _json(fleet, "pool=a")["jobs_across_hosts"] == []
    assert _json(fleet, "state=held")["jobs_across_hosts"] == []


def test_a_pool_filtered_summary_from_agents_counts_counts_only_that_pool(
    own_fleet: Cli, store: Store, prefix: str
) -> None:
    """Hosts of both pools have agents' counts: ``pool=b`` must count b's alone."""
    layout = KeyLayout(prefix)
    lease = store.grant_lease(60)  # counts are used only while an agent's lease keeps them
    try:
        for host, gpus, held in (("node03", 2, 1), ("node04", 2, 0), ("gpu-1", 4, 2)):
            counts = HostCounts(host, tuple(range(gpus)), free=gpus - held, held=held)
            store.put(layout.host_counts(host), counts.to_json(), lease=lease)
        filtered = _json(own_fleet, "--summary", "pool=b")
        assert [row["pool"] for row in filtered["pools"]] == ["b"]
        total = filtered["total"]
        assert (total["hosts"], total["gpus"], total["held"], total["free"]) == (1, 4, 2, 2)
        everything = _json(own_fleet, "--summary")
        assert everything["total"]["hosts"] == 14 and everything["total"]["held"] == 4
    finally:
        store.revoke_lease(lease)
