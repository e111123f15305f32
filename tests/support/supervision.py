"""A supervisor driven by tests: real processes, an injected clock, recorded events.

Every worker is ``tests/support/dummy_worker.py`` run with this interpreter;
it writes a JSON report (pid, start time, environment) and then behaves as
its options say. Nothing here sleeps for a fixed time: tests poll for a
condition with a deadline. Stop escalation follows an injected clock, so
"the grace period is over" is a clock step, not a wait.

The fixtures (``make_harness``, ``h``, ``other_agent``) are imported by the
test modules that use them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.kernel import procs
from allocator.agent.planning.types import DesiredJob, Device, WorkerSpec
from allocator.agent.processes.launch import SHIM
from allocator.agent.processes.supervisor import Supervisor, WorkerExit
from tests.support.clock import FakeClock
from tests.support.waiting import wait_for

DUMMY = str(Path(__file__).resolve().with_name("dummy_worker.py"))
REPO = Path(__file__).resolve().parents[2]
POLL = 0.01
DEADLINE = 20.0
AGENT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": os.environ.get("HOME", "/"),
    "CUDA_VISIBLE_DEVICES": "7",
    "NVIDIA_VISIBLE_DEVICES": "7",
    "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
    "ALLOCATOR_STORE": "sqlite:///agent-only.db",
    "AGENT_SIDE_VARIABLE": "kept",
}


def poll(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """Return the first truthy value of ``predicate()``, polling until a deadline."""
    return wait_for(what, predicate, timeout, every=POLL)


@dataclass
class Harness:
    """A supervisor with a fake clock, its log events, and every exit it reported."""

    tmp: Path
    clock: FakeClock
    sup: Supervisor
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    exits: list[WorkerExit] = field(default_factory=list)

    def tick(self) -> None:
        self.exits.extend(self.sup.tick())

    def until(self, predicate: Callable[[], Any], what: str) -> Any:
        """Tick until ``predicate()`` holds (or fail at the deadline)."""

        def step() -> Any:
            self.tick()
            return predicate()

        return poll(step, what)

    def report(self, job: str, index: int = 0, suffix: str = "") -> dict[str, Any] | None:
        path = self.tmp / "reports" / f"{job}.{index}.json{suffix}"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        return data

    def wait_report(
        self, job: str, index: int = 0, *, not_pid: int | None = None
    ) -> dict[str, Any]:
        """The worker's report once it is written (by a worker other than ``not_pid``)."""

        def fresh() -> dict[str, Any] | None:
            data = self.report(job, index)
            return data if data is not None and data["pid"] != not_pid else None

        return dict(self.until(fresh, f"report of {job}[{index}]"))

    def event_names(self) -> list[str]:
        """The names of the supervisor's log events, in order."""
        return [name for name, _ in self.events]

    def pids(self, job: str) -> list[int]:
        """The main pids the supervisor reports for ``job``, once it knows all of them."""

        def known() -> list[int] | None:
            self.tick()
            record = self.sup.records()[job]
            workers = len(self.sup.views()[job].exit_codes)
            return list(record["pids"]) if len(record["pids"]) == workers else None

        return list(poll(known, f"the main pids of {job}"))


def job_spec(
    tmp: Path,
    name: str = "train",
    *,
    args: tuple[str, ...] = (),
    worker_args: tuple[tuple[str, ...], ...] = (),
    gpus: tuple[int, ...] = (0,),
    device: Device = "cuda",
    env: dict[str, str] | None = None,
    on_change: str = "restart",
    grace: float = 0.5,
    max_restarts: int = 3,
    per_gpu: bool = False,
    cwd: str | None = None,
    argv: tuple[str, ...] | None = None,
) -> DesiredJob:
    """A desired job running the dummy worker (one worker, or one per GPU)."""
    count = len(gpus) if per_gpu else 1
    workers = []
    for index in range(count):
        out = tmp / "reports" / f"{name}.{index}.json"
        extra = worker_args[index] if worker_args else ()
        command = argv or (sys.executable, DUMMY, "--out", str(out), *args, *extra)
        seen = (gpus[index],) if per_gpu else gpus
        worker_env = {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, seen)) if device == "cuda" else "",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "ALLOCATOR_JOB": name,
            "ALLOCATOR_DEVICE": device,
            **(env or {}),
        }
        workers.append(WorkerSpec(name, index, command, worker_env, cwd, seen, device))
    digest = hashlib.sha256(
        repr([(w.argv, sorted(w.env.items()), w.cwd) for w in workers]).encode()
    ).hexdigest()
    return DesiredJob(
        job=name,
        state="run",
        workers=tuple(workers),
        fingerprint=digest,
        on_change=on_change,
        grace_seconds=grace,
        max_restarts=max_restarts,
        backoff_base=1.0,
        backoff_max=30.0,
        gpus=gpus,
        device=device,
        fallback_reason=None,
        message="",
        assignment_revision=1,
    )


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, or None while it does not exist."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    stat = procs.read_stat(pid)
    return stat is not None and stat.state != "Z"


def exists(pid: int) -> bool:
    """Whether ``pid`` names any process at all, zombies included."""
    return procs.read_stat(pid) is not None


def kill_reported(tmp: Path) -> None:
    """Last line of defence: SIGKILL every dummy process a test left behind, then reap."""
    groups: list[int] = []
    for path in (tmp / "reports").glob("*.json*"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if procs.same_process_alive(data["pid"], data["start_ticks"]):
            procs.signal_process(data["pid"], signal.SIGKILL)
            groups.append(data["pgid"])
    deadline = time.monotonic() + 10
    while groups and time.monotonic() < deadline:
        for pgid in groups:
            procs.reap_group(pgid)
        groups = [g for g in groups if procs.group_alive(g)]
        time.sleep(POLL)


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Build harnesses on this test's directory; stop and kill everything afterwards."""
    made: list[Harness] = []

    def build(real_clock: bool = False, **kwargs: Any) -> Harness:
        clock = FakeClock()
        events: list[tuple[str, dict[str, Any]]] = []
        sup = Supervisor(
            tmp_path / "logs",
            tmp_path / "state.json",
            base_env=kwargs.pop("base_env", AGENT_ENV),
            clock=time.monotonic if real_clock else clock,
            logger=lambda name, fields: events.append((name, dict(fields))),
            **kwargs,
        )
        harness = Harness(tmp_path, clock, sup, events)
        made.append(harness)
        return harness

    try:
        yield build
    finally:
        for harness in made:
            harness.sup.stop_all(grace=0)
        kill_reported(tmp_path)


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    """One harness with a fake clock."""
    return make_harness()


_HELPER = """
import json, sys
from pathlib import Path
from allocator.agent.planning.types import DesiredJob, Start, Stop, WorkerSpec
from allocator.agent.processes.supervisor import Supervisor

cfg = json.loads(Path(sys.argv[1]).read_text())
sup = Supervisor(Path(cfg["logs"]), Path(cfg["state"]), cgroups=cfg["cgroups"])
for job, argvs in cfg["jobs"].items():
    workers = tuple(
        WorkerSpec(job, i, tuple(argv), cfg["env"], None, (i,), "cuda")
        for i, argv in enumerate(argvs)
    )
    spec = DesiredJob(
        job=job, state="run", workers=workers, fingerprint=f"fp-{job}",
        on_change="restart", grace_seconds=cfg["grace"], max_restarts=3, backoff_base=1.0,
        backoff_max=30.0, gpus=tuple(range(len(workers))), device="cuda",
        fallback_reason=None, message="", assignment_revision=1,
    )
    sup.apply(Start(job, spec, "new"))
print("ready", flush=True)
# It never ticks: exits of its workers stay unreaped while it lives. It obeys
# "stop JOB GRACE" lines, to be killed in the middle of a stop.
for line in sys.stdin:
    _, job, grace = line.split()
    sup.apply(Stop(job, "told to", float(grace)))
    print("ok", flush=True)
"""


@dataclass
class OtherAgent:
    """A supervisor in another process, as an agent that is about to be killed."""

    proc: subprocess.Popen[str]

    def stop(self, job: str, grace: float) -> None:
        """Make it start stopping ``job`` (SIGTERM now, SIGKILL after ``grace``, if it lived)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"stop {job} {grace}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def kill_9(self) -> None:
        """Kill it as ``kill -9`` would: its workers are left to whoever adopts them."""
        self.proc.kill()
        self.proc.wait(timeout=DEADLINE)


@pytest.fixture
def other_agent(tmp_path: Path) -> Iterator[Callable[..., OtherAgent]]:
    """Start jobs from a supervisor running in its own process (killed at teardown).

    ``start({job: [worker args, ...]}, grace=..., cgroups=..., env=..., ready=...)``
    (``env``: variables added to its environment; ``ready=False``: do not wait
    for it to have started every job); each worker
    is the dummy reporting to ``reports/<job>.<index>.json``, each job's
    fingerprint is ``fp-<job>``, and the state file is the harness's.
    """
    started: list[subprocess.Popen[str]] = []

    def start(
        jobs: dict[str, list[list[str]]],
        *,
        grace: float = 0.5,
        cgroups: bool = True,
        env: dict[str, str] | None = None,
        ready: bool = True,
    ) -> OtherAgent:
        argvs = {
            job: [
                [sys.executable, DUMMY, "--out", str(tmp_path / "reports" / f"{job}.{i}.json"), *a]
                for i, a in enumerate(worker_args)
            ]
            for job, worker_args in jobs.items()
        }
        cfg = {
            "jobs": argvs,
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            "grace": grace,
            "cgroups": cgroups,
            "logs": str(tmp_path / "logs"),
            "state": str(tmp_path / "state.json"),
        }
        cfg_path = tmp_path / "other-agent.json"
        cfg_path.write_text(json.dumps(cfg))
        proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(cfg_path)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        started.append(proc)
        assert proc.stdout is not None
        if ready:  # else it is expected to stop on the way (a test's pause point)
            assert proc.stdout.readline().strip() == "ready"
        return OtherAgent(proc)

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=DEADLINE)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


def processes_running(out_path: Path) -> list[int]:
    """Pids of live worker processes (shims aside) whose command line names ``out_path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(SHIM).encode() in cmdline:
            continue
        if str(out_path).encode() in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found
