"""`allocator history` end to end: real CLI processes, SQLite and a real etcd, a real agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import AgentHarness
from tests.e2e.conftest import EXAMPLE_POLICY, Cli, Result, clean_env, history_entries, run_cli
from tests.support.waiting import wait_for


def _gpus(place: dict[str, Any] | None) -> str:
    if place is None:
        return "-"
    return ",".join(place["gpus"]) if place["mode"] == "gpu" else place["mode"]


def _summary(entries: list[dict[str, Any]]) -> list[tuple[str, str | None, str, str]]:
    return [(e["action"], e["job"], _gpus(e["from"]), _gpus(e["to"])) for e in entries]


def test_history_shows_set_move_release_and_policy_apply_newest_first(applied: Cli) -> None:
    assert applied("set", "job=train", "gpus=0,1", "host=node1", "reason=baseline").code == 0
    assert applied("set", "job=train", "gpus=2", "host=node1", "reason=rebalance").code == 0
    assert applied("set", "job=big", "count=2", "host=node2").code == 0
    assert applied("release", "job=train", "reason=done").code == 0

    entries = history_entries(applied)

    assert _summary(entries) == [
        ("release", "train", "2", "-"),
        ("set", "big", "-", "0,1"),
        ("move", "train", "0,1", "2"),
        ("set", "train", "-", "0,1"),
        ("policy-apply", None, "-", "-"),
    ]
    assert [e["reason"] for e in entries] == ["done", None, "rebalance", "baseline", None]
    assert all("@" in e["by"] for e in entries)
    table = applied("history", "job=train")
    assert table.code == 0 and table.out.splitlines()[0].split() == [
        "WHEN", "HOST", "JOB", "ACTION", "FROM", "TO", "BY", "REASON"
    ]  # fmt: skip
    assert [line.split()[3] for line in table.out.splitlines()[1:]] == ["release", "move", "set"]


def test_history_keeps_the_newest_entries_up_to_the_policy_limit(cli: Cli, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE_POLICY.read_text() + "history: {entries_per_host: 3}\n")
    assert cli("policy", "apply", str(policy)).code == 0
    for gpu in (0, 1, 2, 0, 1):
        assert cli("set", "job=train", f"gpus={gpu}", "host=node1").code == 0

    entries = history_entries(cli, "host=node1", "job=train")

    assert [e["seq"] for e in entries] == [4, 3, 2]
    assert _summary(entries) == [
        ("move", "train", "0", "1"),
        ("move", "train", "2", "0"),
        ("move", "train", "1", "2"),
    ]


def test_history_is_readable_after_etcd_compacts_its_ownhistory_entries(
    etcd_server: Any, prefix: str
) -> None:
    env = clean_env(ALLOCATOR_STORE=etcd_server.url, ALLOCATOR_PREFIX=prefix)

    def cli(*args: str) -> Result:
        return run_cli(args, env)

    assert cli("policy", "apply", str(EXAMPLE_POLICY)).code == 0
    assert cli("set", "job=train", "gpus=0", "host=node1").code == 0
    assert cli("set", "job=train", "gpus=1", "host=node1").code == 0
    assert cli("release", "job=train").code == 0
    status = json.loads(etcd_server.etcdctl("endpoint", "status", "-w", "json"))
    revision = status[0]["Status"]["header"]["revision"]
    etcd_server.etcdctl("compact", str(revision), "--physical")

    assert _summary(history_entries(cli, "host=node1")) == [
        ("release", "train", "1", "-"),
        ("move", "train", "0", "1"),
        ("set", "train", "-", "0"),
        ("policy-apply", None, "-", "-"),
    ]


@pytest.fixture
def world(tmp_path: Path, store_url: str, prefix: str) -> Iterator[AgentHarness]:
    """A policy applied, an agent running on a fake host with 4 GPUs."""
    with AgentHarness(tmp_path, store_url, prefix).running() as harness:
        yield harness


def test_history_records_the_agents_fallback_recovery_and_giving_up(world: AgentHarness) -> None:
    assert world.cli("set", "job=train", "gpus=1").code == 0
    on_gpu = world.new_report("train")
    world.gpus.update(1, healthy=False)
    on_cpu = world.new_report("train", not_pid=on_gpu["pid"])
    world.gpus.update(1, healthy=True)
    world.new_report("train", not_pid=on_cpu["pid"])
    assert world.cli("set", "job=crashy", "gpus=3").code == 0

    def decisions() -> list[dict[str, Any]] | None:
        entries = [
            e for e in history_entries(world.cli, "host=node1") if e["by"].startswith("agent@")
        ]
        return entries if len(entries) == 3 else None

    gave_up, recover, fallback = wait_for("the agent's decisions in the history", decisions)
    assert _summary([gave_up, recover, fallback]) == [
        ("gave-up", "crashy", "3", "stopped"),
        ("recover", "train", "cpu", "1"),
        ("fallback", "train", "1", "cpu"),
    ]
    assert "GPU 1" in fallback["reason"] and "crash restarts" in gave_up["reason"]
    assert {e["by"] for e in (gave_up, recover, fallback)} == {"agent@node1"}
