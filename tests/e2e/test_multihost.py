"""One job across two hosts, for real: two agents on this machine as node1 and node2.

Each agent has its own fake-NVML host of 2 GPUs and its own state; both use
one store (SQLite and a real etcd). The all-reduce test runs a genuine
``torch.distributed`` gloo all-reduce across the two hosts' workers, from
nothing but the environment the agents gave them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import DUMMY, AgentHarness, hosts_of, pid_alive
from tests.support.etcd_server import free_port
from tests.support.ranks import two_host_all_reduce
from tests.support.waiting import wait_for

GLOO = Path(__file__).resolve().parents[1] / "support" / "gloo_worker.py"


def two_host_policy(workdir: Path) -> dict[str, Any]:
    """node1 and node2 with 2 GPUs each; an all-reduce job and a dummy job that waits."""
    dummy = [sys.executable, str(DUMMY), "--out", str(workdir / "ring-{host}.json")]
    return {
        "version": 1,
        "hosts": {"node1": {"gpus": 2}, "node2": {"gpus": 2}},
        "jobs": {
            "allreduce": {
                "command": [sys.executable, str(GLOO), str(workdir / "ranks")],
                "workers": "per-gpu",
                # gloo finds its peers on the loopback interface, where both "hosts" live.
                "env": {"GLOO_SOCKET_IFNAME": "lo", "MASTER_PORT": str(free_port())},
                "grace_seconds": 1,
            },
            "ring": {"command": dummy, "fallback": "wait", "grace_seconds": 1},
        },
        "fallback": {"wait": {"action": "wait"}},
        "health": {"interval_seconds": 0.2, "hold_down_seconds": 0.5},
    }


@pytest.fixture
def hosts(tmp_path: Path, store_url: str, prefix: str) -> Iterator[list[AgentHarness]]:
    """node1 and node2, the policy applied; their agents are the test's to start."""
    with hosts_of(tmp_path, store_url, prefix, ("node1", "node2")) as named:
        agents = list(named.values())
        (tmp_path / "ranks").mkdir()
        agents[0].apply_policy(two_host_policy(tmp_path))
        yield agents


def _start(agents: list[AgentHarness], *extra: str) -> None:
    # Both "hosts" are this machine: rank 0 is reached on the loopback address.
    for agent in agents:
        agent.start_agent("--master-addr", "127.0.0.1", *extra)


@pytest.mark.slow
def test_a_job_across_two_hosts_runs_a_real_gloo_all_reduce(hosts: list[AgentHarness]) -> None:
    node1 = hosts[0]
    _start(hosts)
    result = node1.cli("set", "job=allreduce", "host=node1,node2", "count=2", "-o", "json")
    assert result.code == 0, result.err
    port = str(json.loads(result.out)["master_port"])
    ranks = node1.workdir.parent / "ranks"
    envs = two_host_all_reduce(ranks, "four ranks to all-reduce", 60)
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["ALLOCATOR_NNODES"]) for e in envs} == {
        ("127.0.0.1", port, "2")
    }
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {("4", "2")}
    shown = node1.cli("get", "job=allreduce")
    assert shown.code == 0 and shown.out.startswith("allreduce@node1,node2: gpus 0,1 on each")
    env = node1.cli("env", "job=allreduce", "host=node2", "-o", "json")  # what node2's agent gave
    assert env.code == 0, env.err
    assert [{k: w[k] for k in envs[2]} for w in json.loads(env.out)] == envs[2:]


def _ring(agent: AgentHarness) -> dict[str, Any] | None:
    report_path = agent.workdir.parent / f"ring-{agent.host}.json"
    with suppress(FileNotFoundError, ValueError):
        report: dict[str, Any] = json.loads(report_path.read_text())
        if pid_alive(report["pid"]):
            return report
    return None


def test_a_failing_gpu_under_one_host_stops_every_share_until_it_recovers(
    hosts: list[AgentHarness],
) -> None:
    node1, node2 = hosts
    _start(hosts, "--keep-workers-on-exit")
    assert node1.cli("set", "job=ring", "host=node1,node2", "gpus=1").code == 0
    before = [wait_for(f"ring on {a.host}", lambda a=a: _ring(a)) for a in hosts]

    node1.gpus.update(1, healthy=False)  # the job's fallback is "wait": both shares stop
    for report in before:
        wait_for("every share to stop", lambda r=report: not pid_alive(r["pid"]))
    waiting = wait_for("node2's share to wait", lambda: _state(node2, "wait"))
    assert "node1: GPU 1 unhealthy" in waiting.message and waiting.fault is None
    assert node1.worker_record("ring").fault.startswith("GPU 1 unhealthy")  # type: ignore[union-attr]

    node1.gpus.update(1, healthy=True)  # back after the hold-down: both shares start again
    after = [wait_for(f"ring back on {a.host}", lambda a=a: _ring(a)) for a in hosts]
    assert {r["pid"] for r in after}.isdisjoint(r["pid"] for r in before)

    assert node2.stop_agent() == 0  # its workers stay, its lease goes: shown as gone
    status = node1.cli("status")
    line = next(x for x in status.out.splitlines() if x.startswith("ring across node1,node2"))
    assert "node1 rank 0 gpus 1: running" in line
    assert "node2 rank 1 gpus 1, AGENT GONE: last reported running" in line

    released = node1.cli("release", "job=ring")
    assert released.code == 0 and released.out.startswith("released ring@node1,node2")
    wait_for("node1's share to stop", lambda: not pid_alive(after[0]["pid"]))
    assert node1.cli("get", "job=ring").code == 6


def _state(agent: AgentHarness, state: str) -> Any:
    record = agent.worker_record("ring")
    return record if record is not None and record.state == state else None


def test_the_cli_treats_a_job_across_hosts_as_one(tmp_path: Path, prefix: str) -> None:
    cli = AgentHarness(tmp_path, f"sqlite://{tmp_path / 'store.db'}", prefix, gpus=2).cli
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(two_host_policy(tmp_path)))
    assert cli("policy", "apply", str(policy)).code == 0
    assert cli("set", "job=ring", "host=node2,node1", "gpus=0-1", "reason=sweep").code == 0

    for args in (
        ("set", "job=ring", "host=node1", "gpus=0"),
        ("release", "job=ring", "host=node1"),
    ):
        refused = cli(*args)
        assert refused.code == 2 and refused.err.count("\n") == 1, refused.err
        assert "runs across node2,node1 as one job" in refused.err
    twice = cli("set", "job=ring", "host=node1,node1", "count=1")
    assert twice.code == 2 and "node1 is listed twice" in twice.err

    shown = json.loads(cli("get", "job=ring", "-o", "json").out)
    assert shown["nodes"] == ["node2", "node1"] and len(shown["assignments"]) == 2
    (group,) = json.loads(cli("status", "-o", "json").out)["jobs_across_hosts"]
    assert [(s["host"], s["rank"], s["gpus"]) for s in group["shares"]] == [
        ("node2", 0, "0,1"),
        ("node1", 1, "0,1"),
    ]
    released = cli("release", "job=ring", "-o", "json")
    assert released.code == 0 and json.loads(released.out)["released"] == ["node1", "node2"]
    assert cli("get", "job=ring").code == 6


def test_an_idle_job_across_hosts_is_released_whole_without_an_outage(
    hosts: list[AgentHarness],
) -> None:
    node1 = hosts[0]
    policy = two_host_policy(node1.workdir.parent)
    policy["jobs"]["ring"]["idle"] = {"after": "1s", "action": "release"}
    node1.apply_policy(policy)
    _start(hosts)
    assert node1.cli("set", "job=ring", "host=node1,node2", "gpus=1").code == 0
    shares = [wait_for(f"ring on {a.host}", lambda a=a: _ring(a)) for a in hosts]

    # Both shares read 0 %: both agents judge theirs idle, at about the same moment.
    wait_for("ring to be released", lambda: node1.cli("get", "job=ring").code == 6)
    for report in shares:
        wait_for("every share to stop", lambda r=report: not pid_alive(r["pid"]))
    released = [e for a in hosts for e in a.events("idle-released", job="ring")]
    assert len(released) == 1, [a.log_text() for a in hosts]
    history = json.loads(node1.cli("history", "job=ring", "-o", "json").out)["entries"]
    releases = [e for e in history if e["action"] == "release"]
    assert sorted(e["host"] for e in releases) == ["node1", "node2"]
    assert all(e["reason"].startswith("idle for") for e in releases)
    for agent in hosts:  # a refusal is no outage: one connection, never dropped
        assert len(agent.events("store-connected")) == 1, agent.log_text()
        assert not agent.events("store-error") and not agent.events("store-unavailable")
