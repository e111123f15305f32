"""The wait queue and quotas with real CLI processes, on SQLite and on a real etcd.

Waiters are real ``allocator set --wait`` processes racing each other; what
they were granted is read back from the store (assignments, history).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from allocator.control.client import Allocator
from allocator.recipes.queue.wait import QUEUE_TTL_S
from allocator.records.holders import HolderCount
from allocator.store import Store
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

POLICY = """\
version: 1
hosts:
  node1: {gpus: %(gpus)d}
pools:
  main: {hosts: [node1]}
teams:
  team-a: {members: [%(me)s]}
quotas:
  - who: team:team-a
    gpus: %(quota)d
priorities:
  - jobs: ["urgent-*"]
    priority: 5
"""

Waiters = Callable[..., "subprocess.Popen[str]"]


def _apply(cli: Cli, tmp_path: Path, gpus: int, quota: int) -> None:
    from allocator.util.identity import os_user

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY % {"gpus": gpus, "quota": quota, "me": os_user()})
    result = cli("policy", "apply", str(path))
    assert result.code == 0, result.err


@pytest.fixture
def client(store: Store, prefix: str) -> Allocator:
    return Allocator(store, prefix=prefix)


@pytest.fixture
def waiter(cli_env: dict[str, str]) -> Iterator[Waiters]:
    """Start ``allocator set ... --wait`` processes; kill whatever is left at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*words: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "allocator", "set", *words],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _queued(client: Allocator) -> list[str]:
    """The jobs waiting on node1, in queue order."""
    from allocator.recipes.queue.order import decode_queue

    listing = client.store.list(client.layout.host_queue("node1"))
    return [w.entry.job for w in decode_queue(listing.items, lambda _bad: None)]


def _holders(client: Allocator) -> dict[int, list[str]]:
    held: dict[int, list[str]] = {}
    for job, assignment in client.host("node1").assignments.items():
        for gpu in assignment.gpus:
            held.setdefault(gpu, []).append(job)
    return held


def _finished(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


@pytest.mark.slow
def test_twenty_waiters_are_granted_in_queue_order_with_no_gpu_double_booked(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters
) -> None:
    _apply(cli, tmp_path, gpus=2, quota=100)
    assert cli("set", "job=blocker", "count=2").code == 0
    procs = []
    for i in range(20):
        procs.append(waiter(f"job=w{i:02d}", "count=1", "--wait=300s"))
        wait_for(f"w{i:02d} in the queue", lambda i=i: len(_queued(client)) == i + 1, 60)
    assert _queued(client) == [f"w{i:02d}" for i in range(20)]
    assert cli("release", "job=blocker").code == 0
    granted: list[str] = []
    for i, proc in enumerate(procs):
        code, err = _finished(proc)
        assert code == 0, err
        granted.append(f"w{i:02d}")
        held = _holders(client)
        assert all(len(jobs) == 1 for jobs in held.values()), held  # never double-booked
        if len(granted) >= 2:  # both GPUs taken: free the oldest grant for the next waiter
            assert cli("release", f"job={granted[-2]}").code == 0
    order = [
        e["job"]
        for e in json.loads(cli("history", "host=node1", "--limit", "1000", "-o", "json").out)[
            "entries"
        ]
        if e.get("action") == "set" and e["job"].startswith("w")
    ]
    assert list(reversed(order)) == granted  # history lists newest first


def test_a_higher_priority_waiter_is_served_first_and_quotas_hold_under_a_race(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters, prefix: str
) -> None:
    _apply(cli, tmp_path, gpus=8, quota=3)
    racers = [waiter(f"job=q{i}", "count=1") for i in range(6)]
    results = [_finished(proc) for proc in racers]
    assert sorted(code for code, _ in results) == [0, 0, 0, 3, 3, 3], results
    assert all("over quota team-a 3/3 GPUs" in err for code, err in results if code == 3)
    raw = client.store.get(f"{prefix}/v1/holders/team/team-a")
    assert raw is not None and HolderCount.from_json(raw.value).totals() == ({"main": 3}, {})
    # Over quota, a waiter waits: first a plain one, then an urgent one behind it.
    plain = waiter("job=late", "count=1", "--wait=120s")
    wait_for("late in the queue", lambda: _queued(client) == ["late"], 60)
    urgent = waiter("job=urgent-1", "count=1", "--wait=120s")
    wait_for("urgent ahead of late", lambda: _queued(client) == ["urgent-1", "late"], 60)
    listed = json.loads(cli("queue", "-o", "json").out)["queue"]
    assert [q["why"] for q in listed] == ["over quota team-a 3/3 GPUs"] * 2
    holding = [f"q{i}" for i, (code, _) in enumerate(results) if code == 0]
    assert cli("release", f"job={holding[0]}").code == 0
    assert _finished(urgent)[0] == 0
    assert plain.poll() is None and _queued(client) == ["late"]
    assert cli("release", f"job={holding[1]}").code == 0
    assert _finished(plain)[0] == 0
    for job in (holding[2], "urgent-1", "late"):
        assert cli("release", f"job={job}").code == 0
    raw = client.store.get(f"{prefix}/v1/holders/team/team-a")
    assert raw is not None and HolderCount.from_json(raw.value).totals() == ({}, {})


@pytest.mark.slow
def test_a_killed_waiter_leaves_the_queue_within_its_lease(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters
) -> None:
    _apply(cli, tmp_path, gpus=1, quota=100)
    assert cli("set", "job=blocker", "count=1").code == 0
    doomed = waiter("job=doomed", "count=1", "--wait")
    wait_for("doomed in the queue", lambda: _queued(client) == ["doomed"], 60)
    doomed.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.wait()
    wait_for("the entry to go", lambda: _queued(client) == [], QUEUE_TTL_S + 5)
    assert time.monotonic() - killed_at <= QUEUE_TTL_S + 5


def test_ctrl_c_and_the_timeout_remove_the_entry(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters
) -> None:
    _apply(cli, tmp_path, gpus=1, quota=100)
    assert cli("set", "job=blocker", "count=1").code == 0
    patient = waiter("job=patient", "count=1", "--wait")
    wait_for("patient in the queue", lambda: _queued(client) == ["patient"], 60)
    patient.send_signal(signal.SIGINT)
    assert _finished(patient)[0] != 0
    assert _queued(client) == []
    timed = cli("set", "job=brief", "gpus=0", "--wait=1s")
    assert timed.code == 3
    assert "timed out waiting for gpus=0 on node1" in timed.err
    assert "held by job 'blocker'" in timed.err
    assert _queued(client) == []


def test_a_waiter_takes_the_gpus_the_moment_the_holder_releases(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters
) -> None:
    _apply(cli, tmp_path, gpus=1, quota=100)
    assert cli("set", "job=first", "count=1").code == 0
    second = waiter("job=second", "count=1", "--wait=120s")
    wait_for("second in the queue", lambda: _queued(client) == ["second"], 60)
    client.release("node1", "first")
    released_at = time.monotonic()
    wait_for("second to hold GPU 0", lambda: _holders(client).get(0) == ["second"], 10, 0.005)
    handed_over = time.monotonic() - released_at
    assert _finished(second)[0] == 0
    assert handed_over < 1.5, handed_over


def test_a_quota_is_given_back_when_a_leased_assignment_expires_without_a_release(
    cli: Cli, tmp_path: Path, client: Allocator, prefix: str
) -> None:
    _apply(cli, tmp_path, gpus=4, quota=2)
    assert cli("set", "job=leased", "count=2").code == 0
    # Bind the assignment to a lease nobody keeps alive, as `run` does: it goes with it.
    key = client.layout.assignment("node1", "leased")
    held = client.store.get(key)
    assert held is not None
    client.store.put(key, held.value, lease=client.store.grant_lease(1))
    wait_for("the lease to expire", lambda: client.store.get(key) is None, 15)
    taken = cli("set", "job=next", "count=2")
    assert taken.code == 0, taken.err
    raw = client.store.get(f"{prefix}/v1/holders/team/team-a")
    assert raw is not None
    assert list(HolderCount.from_json(raw.value).charges) == ["node1/next"]


def test_a_job_across_hosts_is_held_to_the_quota_as_a_whole(
    cli: Cli, tmp_path: Path, client: Allocator, prefix: str
) -> None:
    from allocator.util.identity import os_user

    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\nhosts:\n  node1: {gpus: 4}\n  node2: {gpus: 4}\n"
        f"quotas:\n  - {{who: 'user:{os_user()}', gpus: 6}}\n"
    )
    assert cli("policy", "apply", str(path)).code == 0
    refused = cli("set", "job=ddp", "count=4", "host=node1,node2")
    assert refused.code == 3 and f"over quota {os_user()} 0/6 GPUs" in refused.err
    assert cli("set", "job=ddp", "count=3", "host=node1,node2").code == 0
    counter = f"{prefix}/v1/holders/user/{os_user()}"
    raw = client.store.get(counter)
    assert raw is not None and HolderCount.from_json(raw.value).totals() == ({"": 6}, {})
    assert cli("release", "job=ddp").code == 0
    raw = client.store.get(counter)
    assert raw is not None and HolderCount.from_json(raw.value).charges == {}


def test_a_quota_holds_when_racers_write_to_different_hosts(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters, prefix: str
) -> None:
    # Writes to different hosts compare no common host key: only the counter stops them.
    from allocator.util.identity import os_user

    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\nhosts:\n"
        + "".join(f"  node{n}: {{gpus: 2}}\n" for n in range(6))
        + f"quotas:\n  - {{who: 'user:{os_user()}', gpus: 3}}\n"
    )
    assert cli("policy", "apply", str(path)).code == 0
    racers = [waiter(f"job=r{n}", "count=1", f"host=node{n}") for n in range(6)]
    results = [_finished(proc) for proc in racers]
    assert sorted(code for code, _ in results) == [0, 0, 0, 3, 3, 3], results
    raw = client.store.get(f"{prefix}/v1/holders/user/{os_user()}")
    assert raw is not None and HolderCount.from_json(raw.value).totals() == ({"": 3}, {})


def test_run_and_set_wait_in_one_queue_in_arrival_order(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters, cli_env: dict[str, str]
) -> None:
    _apply(cli, tmp_path, gpus=1, quota=100)
    assert cli("set", "job=blocker", "count=1").code == 0
    go = tmp_path / "go"
    script = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)"
    words = ["job=r1", "count=1", "host=node1", "--wait", "--", sys.executable, "-c", script]
    ran = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", *words],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("run in the queue", lambda: _queued(client) == ["r1"], 60)
        second = waiter("job=s2", "count=1", "--wait=120s")
        wait_for("set behind run", lambda: _queued(client) == ["r1", "s2"], 60)
        assert cli("release", "job=blocker").code == 0
        wait_for("run to hold GPU 0", lambda: _holders(client).get(0) == ["r1"], 30)
        assert second.poll() is None and _queued(client) == ["s2"]
        go.touch()  # the command ends: run releases, the next waiter takes the GPU
        assert _finished(ran)[0] == 0
        assert _finished(second)[0] == 0
        assert _holders(client).get(0) == ["s2"]
    finally:
        if ran.poll() is None:
            ran.kill()
        ran.communicate()


def test_a_waiter_says_once_whom_it_waits_behind(
    cli: Cli, tmp_path: Path, client: Allocator, waiter: Waiters
) -> None:
    _apply(cli, tmp_path, gpus=2, quota=100)
    assert cli("set", "job=blocker", "count=1").code == 0
    big = waiter("job=big", "count=2", "--wait=120s")  # first in line, for both GPUs
    wait_for("big in the queue", lambda: _queued(client) == ["big"], 60)
    small = cli("set", "job=small", "count=1", "--wait=1s")
    assert small.code == 3
    assert "waiting: behind big (" in small.err, small.err
    assert "waiting behind" not in small.err, small.err
    big.kill()
