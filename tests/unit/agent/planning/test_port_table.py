"""MASTER_PORT allocation: one per job on a host, kept while assigned, busy ports skipped."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from allocator.agent.planning.port_table import PortTable, port_is_free
from allocator.placement.ports import allocate_master_ports, shared_declared_ports
from allocator.placement.worker_env import default_master_port
from allocator.policy.model import Job, Policy
from allocator.records.types import Assignment
from tests.support.ports import colliding_job_names

HOST = "node1"


def per_gpu(name: str, **env: str) -> Job:
    return Job(name=name, command=("python", "t.py"), workers="per-gpu", env=env)


def world(*jobs: Job, host: str = HOST) -> tuple[Policy, dict[str, Assignment]]:
    policy = Policy(version=1, jobs={job.name: job for job in jobs})
    assignments = {
        job.name: Assignment(
            job=job.name,
            host=host,
            gpus=(n,),
            mode="gpu",
            updated_by="ops",
            updated_at="2025-01-01T00:00:00Z",
        )
        for n, job in enumerate(jobs)
    }
    return policy, assignments


def test_jobs_whose_names_hash_to_one_port_get_different_ports() -> None:
    names = colliding_job_names(3)
    policy, assignments = world(*(per_gpu(name) for name in names))
    ports = allocate_master_ports(policy, HOST, assignments, {})
    assert len(set(ports.values())) == 3
    preferred = default_master_port(names[0])
    assert sorted(ports.values()) == [preferred, preferred + 1, preferred + 2]


def test_a_job_keeps_its_port_when_others_come_and_go() -> None:
    a, b = colliding_job_names(2)
    policy, assignments = world(per_gpu(b))
    first = allocate_master_ports(policy, HOST, assignments, {})
    policy, assignments = world(per_gpu(a), per_gpu(b))  # a sorts first and wants b's port
    second = allocate_master_ports(policy, HOST, assignments, first)
    assert second[b] == first[b]
    assert second[a] != second[b]


def test_a_busy_port_is_skipped_for_a_new_job_but_never_taken_from_a_running_one() -> None:
    policy, assignments = world(per_gpu("ranks"))
    preferred = default_master_port("ranks")
    busy = allocate_master_ports(policy, HOST, assignments, {}, is_free=lambda p: p != preferred)
    assert busy == {"ranks": preferred + 1}
    # After an agent restart without its table, a running job's own rank 0 holds its port.
    running = allocate_master_ports(
        policy, HOST, assignments, {}, is_free=lambda p: p != preferred, running={"ranks"}
    )
    assert running == {"ranks": preferred}


def test_a_declared_port_wins_and_is_kept_free_for_its_job() -> None:
    taken = default_master_port("ranks")
    policy, assignments = world(per_gpu("ranks"), per_gpu("pinned", MASTER_PORT=str(taken)))
    ports = allocate_master_ports(policy, HOST, assignments, {"ranks": taken})
    assert "pinned" not in ports  # the policy's port is the job's own
    assert ports["ranks"] == taken + 1


def test_only_per_gpu_jobs_on_this_host_get_ports() -> None:
    single = Job(name="single", command=("x",))
    policy, assignments = world(per_gpu("ranks"), single)
    other_policy, elsewhere = world(per_gpu("far"), host="node2")
    policy = Policy(version=1, jobs={**policy.jobs, **other_policy.jobs})
    assert set(allocate_master_ports(policy, HOST, {**assignments, **elsewhere}, {})) == {"ranks"}


def test_two_jobs_declaring_one_port_are_named() -> None:
    policy, assignments = world(
        per_gpu("a", MASTER_PORT="29500"), per_gpu("b", MASTER_PORT="29500"), per_gpu("c")
    )
    assert shared_declared_ports(policy, HOST, assignments) == {29500: ["a", "b"]}


def test_port_is_free_sees_a_listener() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_is_free(port)


def test_the_table_survives_an_agent_restart(tmp_path: Path) -> None:
    a, b = colliding_job_names(2)
    events: list[tuple[str, dict[str, object]]] = []
    log = lambda e, f: events.append((e, f))  # noqa: E731
    policy, assignments = world(per_gpu(b))
    first = PortTable(tmp_path / "ports.json", log).allocate(policy, HOST, assignments, ())
    policy, assignments = world(per_gpu(a), per_gpu(b))
    again = PortTable(tmp_path / "ports.json", log).allocate(policy, HOST, assignments, ())
    assert again[b] == first[b] and again[a] != again[b]
    assert [e for e, _ in events] == ["master-ports", "master-ports"]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"a": "x", "b": true}'])
def test_a_damaged_table_is_ignored(tmp_path: Path, content: str) -> None:
    (tmp_path / "ports.json").write_text(content)
    table = PortTable(tmp_path / "ports.json", lambda e, f: None)
    assert table.ports == {}
