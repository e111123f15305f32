"""Unassigned and idle detection through the fake NVML, with a fake clock and real workers.

The observer is what the agent's loop calls at its health interval: here a
real supervisor runs a real worker (whose child leaves its session), the
fake NVML file says which processes sit on which GPU and how busy each GPU
is, and the clock moves by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.gpu_care.observe import Observer
from allocator.agent.gpu_care.tree_cpu import TreeCpu
from allocator.agent.planning.types import IdleRelease, Start
from allocator.policy import load_policy
from allocator.records.types import Assignment
from tests.support import supervision
from tests.support.clock import FakeClock
from tests.support.fake_gpus import FakeGpus
from tests.support.supervision import Harness, job_spec, poll

make_harness = supervision.make_harness
START = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
POLICY = load_policy(
    json.dumps(
        {
            "version": 1,
            "hosts": {"node1": {"gpus": 2}},
            "jobs": {"train": {"command": ["x"], "idle": {"after": "2h", "action": "release"}}},
        }
    ),
    source="p.yaml",
)
ASSIGNED = {
    "train": Assignment(
        job="train", host="node1", gpus=(0,), mode="gpu", updated_by="a", updated_at="t"
    )
}


class World:
    """A worker of ``train`` on GPU 0, the fake GPUs, an observer and its clock."""

    def __init__(self, h: Harness, tmp: Path) -> None:
        self.h = h
        self.spec = job_spec(tmp, args=("--spawn-child", "--setsid-child"), gpus=(0,))
        h.sup.apply(Start("train", self.spec, "new"))
        self.main = int(h.wait_report("train")["pid"])
        child = h.report("train", suffix=".child")
        assert child is not None
        self.child = int(child["pid"])
        self.gpus = FakeGpus(tmp / "nvml.json", 2)
        self.clock = FakeClock()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.observer = Observer(
            self.gpus.environ, "node1", lambda e, f: self.events.append((e, f)), self.clock
        )

    def sample(self, after: float = 5.0) -> Observer:
        self.clock.advance(after)
        wall = START + timedelta(seconds=self.clock.now)
        views, roots = self.h.sup.views(), self.h.sup.process_roots()
        desired = {"train": self.spec}
        self.observer.sample(
            self.clock.now, wall, POLICY, desired, views, roots, ASSIGNED, {"train": 5}, {}
        )
        return self.observer


@pytest.fixture
def world(make_harness: Any, tmp_path: Path) -> Iterator[World]:
    w = World(make_harness(), tmp_path)
    try:
        yield w
    finally:
        w.observer.close()


def test_processes_on_gpus_they_were_not_given_are_found_and_the_jobs_own_are_not(
    world: World, stranger: subprocess.Popen[bytes]
) -> None:
    world.gpus.update(0, processes=[{"pid": world.main, "used_memory_mib": 30000}])
    world.gpus.update(
        1,
        processes=[
            {"pid": world.child, "used_memory_mib": 512},  # train's, on a GPU it was not given
            {"pid": stranger.pid, "used_memory_mib": 4096},
        ],
    )
    found = world.sample().unassigned
    assert [(p.gpu, p.pid, p.job, p.memory_used_mib) for p in found] == sorted(
        [(1, world.child, "train", 512), (1, stranger.pid, None, 4096)]
    )
    notebook = next(p for p in found if p.pid == stranger.pid)
    assert "signal.pause" in notebook.command and notebook.user
    assert [e for e, _ in world.events].count("unassigned-gpu-use") == 2
    world.sample()
    assert [e for e, _ in world.events].count("unassigned-gpu-use") == 2  # said once
    world.gpus.update(1, processes=[])
    assert world.sample().unassigned == ()


def test_an_idle_holder_is_released_after_its_rule_and_a_busy_sample_clears_it(
    world: World,
) -> None:
    world.gpus.update(0, utilization_gpu=2, processes=[{"pid": world.main}])
    world.gpus.update(1, utilization_gpu=95)  # another GPU's work is no alibi
    first = world.sample()
    assert first.releases == () and first.idle_since == {}
    idle_from = START + timedelta(seconds=world.clock.now)
    later = world.sample(after=7200.0)
    assert later.idle_since == {"train": idle_from.isoformat().replace("+00:00", "Z")}
    assert later.releases == (
        IdleRelease("train", 5, "idle for 2h00m (policy idle rule on job train)"),
    )
    world.gpus.update(0, utilization_gpu=60)
    busy = world.sample()
    assert busy.releases == () and busy.idle_since == {}


def test_a_job_whose_workers_do_not_run_is_never_idle(world: World) -> None:
    world.gpus.update(0, utilization_gpu=0)
    os.kill(world.main, signal.SIGKILL)  # crashed: the job's GPU reads 0 % while nothing runs
    world.h.until(lambda: world.h.sup.views()["train"].exit_codes != (None,), "the crash")
    world.sample()
    after = world.sample(after=7200.0)
    assert after.releases == () and after.idle_since == {}
    assert after.idle.idle_seconds(world.clock.now) == {}


def test_no_sample_from_nvml_judges_no_one_idle(world: World) -> None:
    world.gpus.update(0, utilization_gpu=0)
    world.sample()
    world.gpus.system["nvml_error"] = "unknown"
    world.gpus.save()
    after = world.sample(after=7200.0)
    assert after.releases == () and after.idle_since == {}
    assert ("nvml-usage-failed", {"error": "NVML failed: Unknown Error"}) in world.events


def test_a_vendor_without_a_sampler_gives_no_usage_and_no_error(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    gpus, clock = FakeGpus(tmp_path / "amd.json", 2, vendor="amd"), FakeClock()
    observer = Observer(gpus.environ, "node1", lambda e, f: events.append((e, f)), clock, "amd")
    assert observer.sampler is None
    observer.sample(clock(), START, POLICY, {}, {}, {}, ASSIGNED, {}, {})
    assert (observer.usage, observer.unassigned, observer.releases) == (None, (), ())
    assert events == []
    observer.close()


def test_a_metrics_port_in_use_is_refused_with_one_clear_error(tmp_path: Path) -> None:
    import socket

    from allocator.errors import InvalidInput

    observer = Observer(
        FakeGpus(tmp_path / "g.json", 1).environ, "node1", lambda e, f: None, FakeClock()
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInput, match=f"--metrics-port {port}: cannot listen"):
            observer.serve_metrics("127.0.0.1", port)
    observer.close()


def _busy_rule_policy(limit: float) -> Any:
    rule = {"after": "1s", "action": "release", "busy_cpu_percent": limit}
    jobs = {name: {"command": ["x"], "idle": rule} for name in ("loader", "quiet")}
    return load_policy(
        json.dumps({"version": 1, "hosts": {"node1": {"gpus": 2}}, "jobs": jobs}), source="p.yaml"
    )


def test_a_job_busy_on_the_cpu_is_not_idle_when_its_rule_says_so(
    make_harness: Any, tmp_path: Path
) -> None:
    import psutil

    h = make_harness()
    spin = (sys.executable, "-c", "while True: pass")  # a data-loading phase: GPUs at 0 %
    specs = {
        "loader": job_spec(tmp_path, "loader", argv=spin, gpus=(0,)),
        "quiet": job_spec(tmp_path, "quiet", gpus=(1,)),
    }
    for name, spec in specs.items():
        h.sup.apply(Start(name, spec, "new"))
    h.wait_report("quiet")
    gpus, clock = FakeGpus(tmp_path / "nvml.json", 2), FakeClock()
    observer = Observer(gpus.environ, "node1", lambda e, f: None, clock)
    observer.tree_cpu = TreeCpu(cpus=1)
    policy, revisions = _busy_rule_policy(20), {"loader": 3, "quiet": 4}
    spinner = psutil.Process(h.sup.process_roots()["loader"][0][0])

    def sample() -> Observer:
        clock.advance(1.0)
        wall = START + timedelta(seconds=clock.now)
        views, roots = h.sup.views(), h.sup.process_roots()
        observer.sample(clock.now, wall, policy, specs, views, roots, {}, revisions, {})
        return observer

    def tree_seconds() -> float:
        tree = [spinner, *spinner.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in tree)

    try:
        assert sample().idle.idle_seconds(clock.now) == {}  # nothing measured yet: not idle
        spent = tree_seconds()
        poll(lambda: tree_seconds() - spent >= 0.5, "the loader to use half a CPU second")
        judged = sample()  # >= 50 % of one CPU over the last second
        assert set(judged.idle.idle_seconds(clock.now)) == {"quiet"}
        assert [r.job for r in sample().releases] == ["quiet"]
    finally:
        observer.close()
