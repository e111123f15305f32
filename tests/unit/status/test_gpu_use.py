"""status shows idle holders (judged against the policy's rules) and unassigned GPU use."""

from __future__ import annotations

from datetime import UTC, datetime

from allocator.cli.output import render_table
from allocator.cli.status import _text
from allocator.policy.model import Host, IdleRule, Job, Policy, Pool
from allocator.records.gpu_info import GpuInfo
from allocator.records.keys import KeyLayout
from allocator.records.types import AgentRecord, Assignment, GpuProcess, WorkerRecord
from allocator.status.join import build_status
from allocator.store import KeyValue

NOW = datetime(2026, 6, 1, 14, 3, tzinfo=UTC)
LAYOUT = KeyLayout("/a")
POLICY = Policy(
    version=1,
    hosts={"n1": Host("n1", 2)},
    pools={"a100": Pool("a100", ("n1",), idle=IdleRule(7200.0, "release"))},
    jobs={
        "train": Job("train", ("x",)),
        "serve": Job("serve", ("y",), idle=IdleRule(action="none")),
    },
)


def _items(idle_since: str | None) -> list[KeyValue]:
    items = []
    for job, gpu in (("train", 0), ("serve", 1)):
        held = Assignment(
            job=job, host="n1", gpus=(gpu,), mode="gpu", updated_by="ops", updated_at="t"
        )
        worker = WorkerRecord(
            job=job, host="n1", state="running", pids=(9,), gpus=(gpu,), idle_since=idle_since
        )
        items.append(KeyValue(LAYOUT.assignment("n1", job), held.to_json(), 1, 1))
        items.append(KeyValue(LAYOUT.workers("n1", job), worker.to_json(), 1, 1))
    agent = AgentRecord(
        host="n1",
        gpus=(GpuInfo(0), GpuInfo(1)),
        unassigned=(
            GpuProcess(gpu=1, pid=4242, user="bob", command="python nb.py", memory_used_mib=4096),
            GpuProcess(gpu=1, pid=77, job="train"),
        ),
    )
    items.append(KeyValue(LAYOUT.agent("n1"), agent.to_json(), 1, 1, lease=5))
    return items


def test_a_job_idle_past_its_pools_rule_is_an_idle_holder_and_an_exempt_one_is_not() -> None:
    (host,) = build_status(POLICY, _items("2026-06-01T12:00:00Z"), LAYOUT, NOW)
    train, serve = sorted(host.jobs, key=lambda j: j.job != "train")
    assert (train.idle_seconds, train.idle_holder) == (7380.0, True)
    assert train.idle_rule == "release after 2h (pool a100)"
    assert (serve.idle_holder, serve.idle_rule) == (False, None)  # action: none
    assert [(g.idle, g.idle_holder) for g in host.gpus] == [("2h03m", True), ("2h03m", False)]


def test_a_busy_job_shows_no_idle_time() -> None:
    (host,) = build_status(POLICY, _items(None), LAYOUT, NOW)
    assert [(j.idle_since, j.idle_holder) for j in host.jobs] == [(None, False)] * 2
    assert [g.idle for g in host.gpus] == [None, None]


def test_unassigned_processes_are_listed_on_their_gpu_and_in_the_text() -> None:
    (host,) = build_status(POLICY, _items("2026-06-01T12:00:00Z"), LAYOUT, NOW)
    assert host.gpus[0].unassigned == ()
    assert [p["pid"] for p in host.gpus[1].unassigned] == [4242, 77]
    assert host.to_dict()["gpus"][1]["unassigned"][0] == {
        "pid": 4242,
        "user": "bob",
        "command": "python nb.py",
        "memory_used_mib": 4096,
        "job": None,
    }
    text = _text([host], render_table)
    assert "2h03m !" in text  # the IDLE column marks the holder past its rule
    assert "idle holders:\n  n1 train: idle for 2h03m (release after 2h (pool a100))" in text
    assert "n1 GPU 1: pid 4242 bob (python nb.py), 4096 MiB" in text
    assert "n1 GPU 1: pid 77 user unknown (not visible to the agent), a process of job train" in (
        text
    )
