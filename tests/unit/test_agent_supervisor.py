"""The supervisor against real processes: environment, stops, exits, crashes, adoption.

Every worker is ``tests/support/dummy_worker.py`` run with this interpreter;
it writes a JSON report (pid, start time, environment) and then behaves as
its options say. Nothing here sleeps for a fixed time: tests poll for a
condition with a deadline. Stop escalation follows an injected clock, so
"the grace period is over" is a clock step, not a wait.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent import procs
from allocator.agent.model import (
    Accept,
    DesiredJob,
    Device,
    Forget,
    GiveUp,
    ScheduleRestart,
    SignalJob,
    Start,
    Stop,
    WorkerSpec,
)
from allocator.agent.reconcile import plan
from allocator.agent.runtime import STABLE_RUN_SECONDS
from allocator.agent.supervisor import Supervisor, WorkerExit, clean_base_env
from tests.support.clock import FakeClock
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")

DUMMY = str(Path(__file__).resolve().parents[1] / "support" / "dummy_worker.py")
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
        return [name for name, _ in self.events]


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


def _alive(pid: int) -> bool:
    stat = procs.read_stat(pid)
    return stat is not None and stat.state != "Z"


def _kill_reported(tmp: Path) -> None:
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
        _kill_reported(tmp_path)


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()


# --- environment and start -------------------------------------------------------------


def test_worker_starts_with_the_specs_environment_in_its_own_session(h: Harness) -> None:
    spec = job_spec(h.tmp, gpus=(2, 3), env={"JOB_SETTING": "x"}, cwd=str(h.tmp))
    h.sup.apply(Start("train", spec, "new"))
    report = h.wait_report("train")
    env = report["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # the spec's, never the agent's "7"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["ALLOCATOR_JOB"] == "train"
    assert env["JOB_SETTING"] == "x"
    assert env["AGENT_SIDE_VARIABLE"] == "kept"
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert "ALLOCATOR_STORE" not in env
    assert report["cwd"] == str(h.tmp)
    assert report["pgid"] == report["sid"] == report["pid"]
    view = h.sup.views()["train"]
    assert (view.alive, view.exit_codes, view.stopping) == (1, (None,), False)
    assert (view.fingerprint, view.gpus, view.device) == (spec.fingerprint, (2, 3), "cuda")
    record = h.sup.records()["train"]
    assert record["pids"] == [report["pid"]]
    assert record["state"] == "running"
    assert record["gpus"] == [2, 3]
    assert len(record["start_times"]) == 1
    assert abs(record["start_times"][0] - time.time()) < 3600


def test_cpu_worker_sees_no_gpu_even_though_the_agent_has_one(h: Harness) -> None:
    h.sup.apply(Start("cpujob", job_spec(h.tmp, "cpujob", gpus=(), device="cpu"), "new"))
    env = h.wait_report("cpujob")["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["ALLOCATOR_DEVICE"] == "cpu"


def test_a_spec_without_visible_devices_does_not_inherit_the_agents(h: Harness) -> None:
    spec = job_spec(h.tmp)
    bare = replace(spec.workers[0], env={"ALLOCATOR_JOB": "train"})
    h.sup.apply(Start("train", replace(spec, workers=(bare,)), "new"))
    env = h.wait_report("train")["env"]
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert "CUDA_DEVICE_ORDER" not in env


def test_per_gpu_ranks_of_the_same_command_report_and_lock_apart(h: Harness) -> None:
    out, lock = str(h.tmp / "reports" / "ranks.json"), str(h.tmp / "ranks.lock")
    same = (sys.executable, DUMMY, "--out", out, "--lock", lock)
    spec = job_spec(h.tmp, "ranks", gpus=(2, 0), per_gpu=True, argv=same)
    ranked = tuple(replace(w, env={**w.env, "LOCAL_RANK": str(w.index)}) for w in spec.workers)
    h.sup.apply(Start("ranks", replace(spec, workers=ranked), "new"))
    reports = [
        poll(functools.partial(_read, h.tmp / "reports" / name), name)
        for name in ("ranks.json", "ranks.json.rank1")
    ]
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in reports] == ["2", "0"]
    assert [r["lock_acquired_at_once"] for r in reports] == [True, True]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data


def test_clean_base_env_strips_gpu_selection_and_allocator_settings() -> None:
    cleaned = clean_base_env(AGENT_ENV)
    assert cleaned == {
        "PATH": AGENT_ENV["PATH"],
        "HOME": AGENT_ENV["HOME"],
        "AGENT_SIDE_VARIABLE": "kept",
    }


def test_output_goes_to_per_job_and_per_worker_log_files(h: Harness) -> None:
    h.sup.apply(Start("single", job_spec(h.tmp, "single"), "new"))
    h.sup.apply(Start("ranks", job_spec(h.tmp, "ranks", gpus=(0, 1), per_gpu=True), "new"))
    logs = [("single", 0, "single.log"), ("ranks", 0, "ranks.0.log"), ("ranks", 1, "ranks.1.log")]
    for job, index, log in logs:
        pid = h.wait_report(job, index)["pid"]
        path = h.tmp / "logs" / log

        def logged(path: Path = path, pid: int = pid) -> bool:
            text = path.read_text() if path.exists() else ""
            return f"{pid} started (stdout)" in text and f"{pid} started (stderr)" in text

        poll(logged, f"output of {job}[{index}] in {log}")
        assert f"starting job {job} worker {index}" in path.read_text()


# --- stopping ------------------------------------------------------------------------------


def test_stop_terminates_the_group_and_is_not_a_crash(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, args=("--spawn-child",)), "new"))
    report = h.wait_report("train")
    h.sup.apply(Stop("train", "assignment released", 5.0))
    assert h.sup.views()["train"].stopping
    h.until(lambda: h.sup.views()["train"].alive == 0, "group gone")
    assert not _alive(report["pid"]) and not _alive(report["child_pid"])
    view = h.sup.views()["train"]
    assert view.exit_codes == (128 + signal.SIGTERM,)
    assert not view.stopping
    assert [(e.exit_code, e.crash) for e in h.exits] == [(143, False)]
    assert h.sup.records()["train"]["state"] == "stopped"
    assert "killed" not in h.event_names()  # SIGTERM sufficed: no escalation


def test_stop_escalates_to_sigkill_for_a_group_that_ignores_sigterm(h: Harness) -> None:
    args = ("--ignore-sigterm", "--spawn-child")
    h.sup.apply(Start("train", job_spec(h.tmp, args=args, grace=0.5), "new"))
    report = h.wait_report("train")
    h.sup.apply(Stop("train", "assignment changed", 0.5))
    for _ in range(5):  # within the grace period nothing is killed: both ignore SIGTERM
        h.tick()
    assert _alive(report["pid"]) and _alive(report["child_pid"])
    assert h.sup.views()["train"].alive == 1
    h.clock.advance(0.6)
    h.until(lambda: h.sup.views()["train"].alive == 0, "group killed")
    assert not _alive(report["pid"]) and not _alive(report["child_pid"])
    assert h.sup.views()["train"].exit_codes == (128 + signal.SIGKILL,)
    assert "killed" in h.event_names()
    assert not any(e.crash for e in h.exits)


def test_no_replacement_starts_until_the_old_group_is_gone(h: Harness) -> None:
    old_spec = job_spec(h.tmp, args=("--ignore-sigterm", "--spawn-child"), gpus=(0,))
    h.sup.apply(Start("train", old_spec, "new"))
    old = h.wait_report("train")
    h.sup.apply(Stop("train", "assignment changed", 0.5))
    new_spec = job_spec(h.tmp, gpus=(1,))
    h.sup.apply(Start("train", new_spec, "change"))  # too early: the old group still runs
    assert "start-refused" in h.event_names()
    assert h.sup.views()["train"].fingerprint == old_spec.fingerprint
    assert h.sup.records()["train"]["pids"] == [old["pid"]]
    h.clock.advance(1.0)
    h.until(lambda: h.sup.views()["train"].alive == 0, "old group gone")
    h.sup.apply(Start("train", new_spec, "change"))
    new = h.wait_report("train", not_pid=old["pid"])
    assert new["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    view = h.sup.views()["train"]
    assert (view.fingerprint, view.change_restarts, view.crash_restarts) == (
        new_spec.fingerprint,
        1,
        0,
    )


def test_plan_and_supervisor_move_a_job_to_another_gpu(h: Harness) -> None:
    """The planner and supervisor together: stop, wait for the whole group, then start."""
    args = ("--ignore-sigterm", "--spawn-child", "--lock", str(h.tmp / "train.lock"))
    desired = {"train": job_spec(h.tmp, args=args, gpus=(0,), grace=0.5)}

    def converge(until: Callable[[], Any], what: str) -> Any:
        def step() -> Any:
            h.clock.advance(0.1)
            for action in plan(desired, h.sup.views(), h.clock()):
                h.sup.apply(action)
            return until()

        return h.until(step, what)

    first = converge(lambda: h.report("train"), "first start")
    desired["train"] = job_spec(h.tmp, args=args, gpus=(1,), grace=0.5)
    second = converge(
        lambda: (r := h.report("train")) is not None and r["pid"] != first["pid"] and r,
        "restart on GPU 1",
    )
    assert second["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert first["lock_acquired_at_once"] is True
    assert second["lock_acquired_at_once"] is True  # nothing of the old worker held it
    assert not _alive(first["pid"]) and not _alive(first["child_pid"])
    names = h.event_names()
    stopped_at = names.index("stopped")
    started = [i for i, name in enumerate(names) if name == "worker-started"]
    assert len(started) == 2 and started[0] < stopped_at < started[1]
    assert h.sup.views()["train"].change_restarts == 1


def test_the_dummy_workers_lock_exposes_overlapping_workers(h: Harness) -> None:
    """The lock check above can fail: a worker started beside a live one reports it."""
    lock = ("--lock", str(h.tmp / "shared.lock"))
    h.sup.apply(Start("a", job_spec(h.tmp, "a", args=(*lock, "--spawn-child")), "new"))
    first = h.wait_report("a")
    os.kill(first["pid"], signal.SIGKILL)  # its child lives on and still holds the lock
    h.sup.apply(Start("b", job_spec(h.tmp, "b", args=lock), "new"))
    waiter = h.sup.records()["b"]["pids"][0]
    poll(lambda: _waits_for_a_lock(waiter), "the second worker to block on the lock")
    assert h.report("b") is None
    os.kill(first["child_pid"], signal.SIGKILL)
    assert h.wait_report("b")["lock_acquired_at_once"] is False


def _waits_for_a_lock(pid: int) -> bool:
    """Whether ``pid`` is blocked waiting for a file lock (``->`` lines of /proc/locks)."""
    lines = Path("/proc/locks").read_text().splitlines()
    return any("->" in line and line.split()[-4] == str(pid) for line in lines)


def test_stop_all_stops_every_job_and_waits_until_all_are_gone(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(real_clock=True)  # stop_all waits in real time for the grace period
    h.sup.apply(Start("a", job_spec(h.tmp, "a", args=("--spawn-child",)), "new"))
    args = ("--ignore-sigterm", "--spawn-child")
    h.sup.apply(Start("b", job_spec(h.tmp, "b", args=args), "new"))
    reports = [h.wait_report("a"), h.wait_report("b")]
    h.sup.stop_all(grace=0.2)
    pids = [pid for r in reports for pid in (r["pid"], r["child_pid"])]
    assert not any(_alive(pid) for pid in pids)
    assert {name: view.alive for name, view in h.sup.views().items()} == {"a": 0, "b": 0}
    assert h.sup.views()["b"].exit_codes == (137,)
    assert "stop-incomplete" not in h.event_names()


# --- exits and crashes ---------------------------------------------------------------------


def test_crash_exit_code_is_recorded(h: Harness) -> None:
    h.sup.apply(
        Start("train", job_spec(h.tmp, args=("--exit-after", "0", "--exit-code", "3")), "new")
    )
    h.until(lambda: h.sup.views()["train"].alive == 0, "worker exit")
    assert [(e.job, e.index, e.exit_code, e.crash) for e in h.exits] == [("train", 0, 3, True)]
    assert h.sup.views()["train"].exit_codes == (3,)
    record = h.sup.records()["train"]
    assert (record["state"], record["last_exit"], record["pids"]) == ("crashed", 3, [])


def test_clean_exit_is_not_a_crash(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, args=("--exit-after", "0")), "new"))
    h.until(lambda: h.sup.views()["train"].alive == 0, "worker exit")
    assert [(e.exit_code, e.crash) for e in h.exits] == [(0, False)]
    assert h.sup.records()["train"]["state"] == "exited"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1])
def test_death_by_signal_from_outside_is_a_crash_with_128_plus_n(h: Harness, signum: int) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))
    pid = h.wait_report("train")["pid"]
    os.kill(pid, signum)
    h.until(lambda: h.sup.views()["train"].alive == 0, "worker death")
    assert [(e.exit_code, e.crash) for e in h.exits] == [(128 + signum, True)]
    assert h.sup.records()["train"]["last_exit"] == 128 + signum


def test_a_crashed_worker_stops_its_siblings_without_counting_them_as_crashes(h: Harness) -> None:
    worker_args = (("--exit-after", "0", "--exit-code", "3"), ())
    spec = job_spec(h.tmp, gpus=(0, 1), per_gpu=True, worker_args=worker_args)
    h.sup.apply(Start("train", spec, "new"))
    h.wait_report("train", 1)
    h.until(lambda: h.sup.views()["train"].exit_codes[0] == 3, "rank 0 crash")
    assert h.sup.views()["train"].alive == 1
    h.sup.apply(Stop("train", "worker crashed", 0.5))
    h.until(lambda: h.sup.views()["train"].alive == 0, "rank 1 stopped")
    assert h.sup.views()["train"].exit_codes == (3, 143)
    assert [(e.index, e.crash) for e in h.exits] == [(0, True), (1, False)]
    assert h.sup.records()["train"]["last_exit"] == 3


@pytest.mark.parametrize(
    ("argv", "cwd", "code", "words"),
    [
        (("/nonexistent/worker-binary",), None, 127, "command not found"),
        ((sys.executable, "-c", "pass"), "/nonexistent/dir", 126, "working directory"),
        ((str(Path(DUMMY).parent),), None, 126, "cannot run"),
    ],
)
def test_a_worker_that_cannot_start_is_an_immediate_crash(
    h: Harness, argv: tuple[str, ...], cwd: str | None, code: int, words: str
) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, argv=argv, cwd=cwd), "new"))  # never raises
    h.tick()
    assert [(e.exit_code, e.crash) for e in h.exits] == [(code, True)]
    assert words in h.exits[0].message
    view = h.sup.views()["train"]
    assert (view.alive, view.exit_codes) == (0, (code,))
    assert words in h.sup.records()["train"]["message"]
    assert words in (h.tmp / "logs" / "train.log").read_text()


def test_crash_restarts_are_counted_apart_from_change_restarts(h: Harness) -> None:
    crashing = job_spec(h.tmp, argv=("/nonexistent/worker-binary",), max_restarts=2)
    h.sup.apply(Start("train", crashing, "new"))
    h.tick()
    h.sup.apply(ScheduleRestart("train", h.clock() + 1.0))
    view = h.sup.views()["train"]
    assert view.next_restart_at == h.clock() + 1.0
    assert h.sup.records()["train"]["state"] == "backoff"
    h.sup.apply(Start("train", crashing, "crash"))
    h.sup.apply(Start("train", crashing, "crash"))
    view = h.sup.views()["train"]
    assert (view.crash_restarts, view.change_restarts, view.next_restart_at) == (2, 0, None)
    h.sup.apply(GiveUp("train", "crash loop"))
    assert h.sup.views()["train"].gave_up
    assert h.sup.records()["train"]["state"] == "gave-up"
    assert h.sup.records()["train"]["restarts"] == 2
    fixed = job_spec(h.tmp, gpus=(1,))
    h.sup.apply(Start("train", fixed, "change"))
    view = h.sup.views()["train"]
    assert (view.crash_restarts, view.change_restarts, view.gave_up) == (0, 1, False)
    assert h.sup.records()["train"]["restarts"] == 3


def test_a_crash_after_a_long_stable_run_starts_the_crash_count_again(h: Harness) -> None:
    failing = job_spec(h.tmp, argv=("/nonexistent/worker-binary",))
    h.sup.apply(Start("train", failing, "new"))
    h.sup.apply(Start("train", failing, "crash"))
    h.sup.apply(Start("train", job_spec(h.tmp), "crash"))
    os.kill(h.wait_report("train")["pid"], signal.SIGKILL)  # a quick crash: still a loop
    h.until(lambda: h.sup.views()["train"].alive == 0, "quick crash")
    assert h.sup.views()["train"].crash_restarts == 2
    h.sup.apply(Start("train", job_spec(h.tmp), "crash"))
    pid = h.wait_report("train", not_pid=h.exits[-1].pid)["pid"]
    h.clock.advance(STABLE_RUN_SECONDS)
    os.kill(pid, signal.SIGKILL)
    h.until(lambda: h.sup.views()["train"].alive == 0, "crash after a stable run")
    assert h.sup.views()["train"].crash_restarts == 0
    assert h.sup.records()["train"]["restarts"] == 3


def test_accept_and_signal_record_the_new_fingerprint_without_restarting(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))
    pid = h.wait_report("train")["pid"]
    h.sup.apply(Accept("train", "fingerprint-2"))
    assert h.sup.views()["train"].fingerprint == "fingerprint-2"
    h.sup.apply(SignalJob("train", signal.SIGUSR1, "fingerprint-3"))  # default action: exit
    h.until(lambda: h.sup.views()["train"].alive == 0, "signalled worker exit")
    assert h.sup.views()["train"].fingerprint == "fingerprint-3"
    assert [(e.pid, e.exit_code) for e in h.exits] == [(pid, 128 + signal.SIGUSR1)]


def test_forget_drops_only_jobs_without_live_workers(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))
    h.wait_report("train")
    h.sup.apply(Forget("train"))
    assert "train" in h.sup.views()
    h.sup.apply(Stop("train", "assignment released", 5.0))
    h.until(lambda: h.sup.views()["train"].alive == 0, "stopped")
    h.sup.apply(Forget("train"))
    assert h.sup.views() == {}
    assert json.loads((h.tmp / "state.json").read_text())["jobs"] == {}


# --- state file and adoption ------------------------------------------------------------------

_HELPER = """
import json, signal, sys
from pathlib import Path
from allocator.agent.model import DesiredJob, Start, WorkerSpec
from allocator.agent.supervisor import Supervisor

cfg = json.loads(Path(sys.argv[1]).read_text())
workers = tuple(
    WorkerSpec(cfg["job"], i, tuple(argv), cfg["env"], None, (i,), "cuda")
    for i, argv in enumerate(cfg["argvs"])
)
spec = DesiredJob(
    job=cfg["job"], state="run", workers=workers, fingerprint=cfg["fingerprint"],
    on_change="restart", grace_seconds=0.5, max_restarts=3, backoff_base=1.0,
    backoff_max=30.0, gpus=tuple(range(len(workers))), device="cuda",
    fallback_reason=None, message="", assignment_revision=1,
)
sup = Supervisor(Path(cfg["logs"]), Path(cfg["state"]))
sup.apply(Start(cfg["job"], spec, "new"))
print("ready", flush=True)
signal.pause()  # never ticks again: exits of its workers stay unreaped while it lives
"""


@dataclass
class OtherAgent:
    """A supervisor in another process, as an agent that is about to be killed."""

    proc: subprocess.Popen[str]

    def kill_9(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=DEADLINE)


@pytest.fixture
def other_agent(tmp_path: Path) -> Iterator[Callable[..., OtherAgent]]:
    """Start a job from a supervisor running in its own process (killed at teardown)."""
    started: list[subprocess.Popen[str]] = []

    def start(job: str, worker_args: list[list[str]]) -> OtherAgent:
        argvs = [
            [sys.executable, DUMMY, "--out", str(tmp_path / "reports" / f"{job}.{i}.json"), *a]
            for i, a in enumerate(worker_args)
        ]
        cfg = {
            "job": job,
            "argvs": argvs,
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            "fingerprint": f"fp-{job}",
            "logs": str(tmp_path / "logs"),
            "state": str(tmp_path / "state.json"),
        }
        cfg_path = tmp_path / f"{job}.agent.json"
        cfg_path.write_text(json.dumps(cfg))
        proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER, str(cfg_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return OtherAgent(proc)

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=DEADLINE)
            if proc.stdout is not None:
                proc.stdout.close()


def _processes_running(out_path: Path) -> list[int]:
    """Pids of live processes whose command line names ``out_path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(out_path).encode() in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_adopt_after_kill_9_takes_over_live_workers_without_duplicates(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent("train", [[], []])
    reports = [h.wait_report("train", 0), h.wait_report("train", 1)]
    agent.kill_9()  # h's supervisor already made this process the subreaper for orphans
    report = h.sup.adopt()
    assert report.adopted == ("train",) and report.stale == ()
    assert [w.outcome for w in report.workers] == ["adopted", "adopted"]
    view = h.sup.views()["train"]
    assert (view.fingerprint, view.alive, view.exit_codes) == ("fp-train", 2, (None, None))
    assert h.sup.records()["train"]["pids"] == [r["pid"] for r in reports]
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))  # a duplicate start is refused
    assert "start-refused" in h.event_names()
    for index in (0, 1):
        out = h.tmp / "reports" / f"train.{index}.json"
        assert _processes_running(out) == [reports[index]["pid"]]
    h.sup.stop_all(grace=5.0)
    assert not any(_alive(r["pid"]) for r in reports)
    assert h.sup.views()["train"].exit_codes == (143, 143)


def test_adopted_worker_that_is_not_our_child_is_watched_by_polling(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent("train", [[]])
    pid = h.wait_report("train")["pid"]
    assert h.sup.adopt().adopted == ("train",)  # the other agent still lives and is its parent
    os.kill(pid, signal.SIGKILL)
    h.until(lambda: h.sup.views()["train"].exit_codes[0] is not None, "exit seen by polling")
    assert h.sup.views()["train"].exit_codes == (137,)  # read from the zombie's /proc entry
    assert h.sup.views()["train"].alive == 1  # the unreaped zombie still holds the group
    assert [e.crash for e in h.exits] == [True]
    agent.kill_9()  # now the zombie comes to us (subreaper) and is reaped
    h.until(lambda: h.sup.views()["train"].alive == 0, "group gone")


def test_adopt_refuses_a_pid_whose_start_time_does_not_match(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent("train", [[]])
    pid = h.wait_report("train")["pid"]
    agent.kill_9()
    state_path = h.tmp / "state.json"
    state = json.loads(state_path.read_text())
    state["jobs"]["train"]["workers"][0]["start_ticks"] += 1  # as if the pid were reused
    state_path.write_text(json.dumps(state))
    report = h.sup.adopt()
    assert report.adopted == () and report.stale == ("train",)
    assert [w.outcome for w in report.workers] == ["reused"]
    assert h.sup.views() == {}
    assert _alive(pid)  # someone else's process now: left alone (teardown kills it)
    assert json.loads(state_path.read_text())["jobs"] == {}


def test_adopt_tracks_orphans_of_a_dead_worker_so_they_get_stopped(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent("train", [["--spawn-child"]])
    report = h.wait_report("train")
    agent.kill_9()
    os.kill(report["pid"], signal.SIGKILL)  # the main process dies, its child lives on
    os.waitpid(report["pid"], 0)  # orphaned to us by the kill above; init would reap it
    adopted = h.sup.adopt()
    assert [w.outcome for w in adopted.workers] == ["orphans"]
    view = h.sup.views()["train"]
    assert (view.alive, view.exit_codes) == (1, (procs.UNKNOWN_EXIT,))
    h.sup.apply(Stop("train", "worker crashed", 0.5))
    h.until(lambda: h.sup.views()["train"].alive == 0, "orphans stopped")
    assert not _alive(report["child_pid"])


def test_adopt_forgets_dead_workers_and_survives_a_bad_state_file(h: Harness) -> None:
    state_path = h.tmp / "state.json"
    state_path.write_text("{not json")
    assert h.sup.adopt().adopted == ()
    assert "state-unreadable" in h.event_names()
    h.sup.apply(Start("train", job_spec(h.tmp, args=("--exit-after", "0")), "new"))
    h.until(lambda: h.sup.views()["train"].alive == 0, "worker exit")
    state = json.loads(state_path.read_text())
    state["jobs"]["broken"] = {"spec": {}}
    state_path.write_text(json.dumps(state))
    report = make_second_supervisor(h).adopt()
    assert report.adopted == () and sorted(report.stale) == ["broken", "train"]


def make_second_supervisor(h: Harness) -> Supervisor:
    return Supervisor(
        h.tmp / "logs", h.tmp / "state.json", base_env=AGENT_ENV, clock=h.clock, logger=_quiet
    )


def _quiet(name: str, fields: dict[str, Any]) -> None:
    """A logger that drops everything."""


def test_state_file_is_private_and_names_pids_and_start_times(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, gpus=(1,)), "new"))
    report = h.wait_report("train")
    path = h.tmp / "state.json"
    assert path.stat().st_mode & 0o777 == 0o600
    worker = json.loads(path.read_text())["jobs"]["train"]["workers"][0]
    assert (worker["pid"], worker["pgid"]) == (report["pid"], report["pid"])
    assert worker["start_ticks"] == report["start_ticks"]
    assert worker["env"]["CUDA_VISIBLE_DEVICES"] == "1"


# --- low-level helpers -------------------------------------------------------------------------


def test_parse_stat_copes_with_parentheses_and_spaces_in_the_command_name() -> None:
    rest = " ".join(str(n) for n in range(4, 53))  # fields 4..52 hold their own numbers
    stat = procs.parse_stat(42, f"42 (we ird) (name)) Z {rest}")
    assert (stat.state, stat.ppid, stat.pgrp, stat.session) == ("Z", 4, 5, 6)
    assert (stat.start_ticks, stat.exit_status) == (22, 52)


def test_exit_codes_follow_the_shell_convention() -> None:
    assert procs.exit_code_of(3 << 8) == 3
    assert procs.exit_code_of(signal.SIGKILL) == 137
    assert procs.describe_exit(143) == "143 (SIGTERM)"
    assert procs.describe_exit(procs.UNKNOWN_EXIT) == "unknown exit status"
