"""The supervisor against real processes: environment, stops, exits, crashes.

Every worker is ``tests/support/dummy_worker.py`` under its shim; see
:mod:`tests.support.supervision` for the harness. Adoption after an agent
restart is in ``test_agent_adoption.py``, process trees in ``test_agent_tree.py``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.kernel import procs
from allocator.agent.planning.exit_codes import UNKNOWN_EXIT, describe_exit
from allocator.agent.planning.job_phase import (
    BackingOff,
    Crashed,
    GaveUp,
    Running,
    Stopped,
    Stopping,
)
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import (
    Accept,
    DesiredJob,
    Forget,
    GiveUp,
    ScheduleRestart,
    SignalJob,
    Start,
    StartCause,
    Stop,
)
from allocator.agent.processes.job_state import STABLE_RUN_SECONDS
from allocator.agent.processes.supervisor import clean_base_env
from tests.support import supervision
from tests.support.supervision import AGENT_ENV, DUMMY, Harness, alive, job_spec, poll

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
make_harness = supervision.make_harness
h = supervision.h


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
    # Its shim leads a session and process group of their own; the worker is its child.
    shim = report["ppid"]
    assert report["pgid"] == report["sid"] == shim != os.getpid()
    assert procs.read_stat(shim).session == shim  # type: ignore[union-attr]
    view = h.sup.views()["train"]
    assert (view.alive, view.exit_codes, type(view.phase)) == (1, (None,), Running)
    assert (view.fingerprint, view.gpus, view.device) == (spec.fingerprint, (2, 3), "cuda")
    assert h.pids("train") == [report["pid"]]  # the worker's own pid, not its shim's
    record = h.sup.records()["train"]
    assert record["state"] == "running"
    assert record["gpus"] == [2, 3]
    assert len(record["start_times"]) == 1
    assert abs(record["start_times"][0] - time.time()) < 3600


def test_the_shim_runs_with_none_of_the_workers_environment(h: Harness) -> None:
    """The shim may be root for a worker that is not: a job's LD_* must never reach it."""
    libs = str(h.tmp / "libs")
    h.sup.apply(Start("train", job_spec(h.tmp, env={"LD_LIBRARY_PATH": libs}), "new"))
    report = h.wait_report("train")
    assert report["env"]["LD_LIBRARY_PATH"] == libs
    assert report["env"]["AGENT_SIDE_VARIABLE"] == "kept"
    shim_env = Path(f"/proc/{report['ppid']}/environ").read_bytes().split(b"\0")
    leaked = [v for v in shim_env if libs.encode() in v or v.startswith((b"AGENT_", b"ALLOC"))]
    assert leaked == []


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
    assert isinstance(h.sup.views()["train"].phase, Stopping)
    h.until(lambda: h.sup.views()["train"].alive == 0, "group gone")
    assert not alive(report["pid"]) and not alive(report["child_pid"])
    view = h.sup.views()["train"]
    assert view.exit_codes == (128 + signal.SIGTERM,)
    assert view.phase == Stopped()
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
    assert alive(report["pid"]) and alive(report["child_pid"])
    assert h.sup.views()["train"].alive == 1
    h.clock.advance(0.6)
    h.until(lambda: h.sup.views()["train"].alive == 0, "group killed")
    assert not alive(report["pid"]) and not alive(report["child_pid"])
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
    assert not alive(first["pid"]) and not alive(first["child_pid"])
    names = h.event_names()
    stopped_at = names.index("stopped")
    started = [i for i, name in enumerate(names) if name == "worker-started"]
    assert len(started) == 2 and started[0] < stopped_at < started[1]
    assert h.sup.views()["train"].change_restarts == 1


def test_the_dummy_workers_lock_exposes_overlapping_workers(h: Harness) -> None:
    """The lock check above can fail: a worker started beside a live holder reports it."""
    lock = str(h.tmp / "shared.lock")
    out = h.tmp / "reports" / "holder.json"
    holder = subprocess.Popen([sys.executable, DUMMY, "--out", str(out), "--lock", lock])
    try:
        poll(out.exists, "the holder to take the lock")
        h.sup.apply(Start("b", job_spec(h.tmp, "b", args=("--lock", lock)), "new"))
        waiter = h.pids("b")[0]
        poll(lambda: _waits_for_a_lock(waiter), "the second worker to block on the lock")
        assert h.report("b") is None
        holder.kill()
        assert h.wait_report("b")["lock_acquired_at_once"] is False
    finally:
        holder.kill()
        holder.wait()


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
    assert not any(alive(pid) for pid in pids)
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
    view = h.sup.views
    h.until(lambda: view()["train"].exit_codes[0] == 3 and view()["train"].alive == 1, "crash")
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
    h.until(lambda: h.sup.views()["train"].alive == 0, "the failed start to be over")
    assert [(e.exit_code, e.crash) for e in h.exits] == [(code, True)]
    assert words in h.exits[0].message
    view = h.sup.views()["train"]
    assert (view.alive, view.exit_codes) == (0, (code,))
    assert words in h.sup.records()["train"]["message"]
    assert words in (h.tmp / "logs" / "train.log").read_text()


def _start_and_fail(h: Harness, spec: DesiredJob, cause: StartCause) -> None:
    h.sup.apply(Start(spec.job, spec, cause))
    h.until(lambda: h.sup.views()[spec.job].alive == 0, "the failed start to be over")


def test_crash_restarts_are_counted_apart_from_change_restarts(h: Harness) -> None:
    crashing = job_spec(h.tmp, argv=("/nonexistent/worker-binary",), max_restarts=2)
    _start_and_fail(h, crashing, "new")
    h.sup.apply(ScheduleRestart("train", h.clock() + 1.0))
    view = h.sup.views()["train"]
    assert view.phase == BackingOff(h.clock() + 1.0)
    assert h.sup.records()["train"]["state"] == "backoff"
    _start_and_fail(h, crashing, "crash")
    _start_and_fail(h, crashing, "crash")
    view = h.sup.views()["train"]
    assert (view.crash_restarts, view.change_restarts, view.phase) == (2, 0, Crashed())
    h.sup.apply(GiveUp("train", "crash loop"))
    assert h.sup.views()["train"].phase == GaveUp()
    assert h.sup.records()["train"]["state"] == "gave-up"
    assert h.sup.records()["train"]["restarts"] == 2
    fixed = job_spec(h.tmp, gpus=(1,))
    h.sup.apply(Start("train", fixed, "change"))
    view = h.sup.views()["train"]
    assert (view.crash_restarts, view.change_restarts, type(view.phase)) == (0, 1, Running)
    assert h.sup.records()["train"]["restarts"] == 3


def test_a_crash_after_a_long_stable_run_starts_the_crash_count_again(h: Harness) -> None:
    failing = job_spec(h.tmp, argv=("/nonexistent/worker-binary",))
    _start_and_fail(h, failing, "new")
    _start_and_fail(h, failing, "crash")
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


# --- low-level helpers -------------------------------------------------------------------------


def test_parse_stat_copes_with_parentheses_and_spaces_in_the_command_name() -> None:
    rest = " ".join(str(n) for n in range(4, 53))  # fields 4..52 hold their own numbers
    stat = procs.parse_stat(42, f"42 (we ird) (name)) Z {rest}")
    assert (stat.state, stat.ppid, stat.pgrp, stat.session) == ("Z", 4, 5, 6)
    assert (stat.start_ticks, stat.exit_status) == (22, 52)


def test_exit_codes_follow_the_shell_convention() -> None:
    assert procs.exit_code_of(3 << 8) == 3
    assert procs.exit_code_of(signal.SIGKILL) == 137
    assert describe_exit(143) == "143 (SIGTERM)"
    assert describe_exit(UNKNOWN_EXIT) == "unknown exit status"


# --- a stop the agent ordered is never a crash --------------------------------------------


@pytest.mark.parametrize("meanwhile", ["released", "gpu-wait"])
def test_a_job_stopped_and_wanted_again_within_its_grace_restarts_without_a_crash(
    h: Harness, meanwhile: str
) -> None:
    """Released and set again (or a ``wait`` GPU back) during the grace: no crash counted."""
    spec = job_spec(h.tmp, args=("--ignore-sigterm",), grace=5.0, max_restarts=0)
    interim: dict[str, DesiredJob] = (
        {} if meanwhile == "released" else {"train": replace(spec, state="wait", workers=())}
    )
    seen: list[object] = []

    def reconcile(desired: dict[str, DesiredJob]) -> None:
        h.tick()
        for action in plan(desired, h.sup.views(), h.clock()):
            seen.append(action)
            h.sup.apply(action)

    reconcile({"train": spec})
    first = h.wait_report("train")
    reconcile(interim)  # SIGTERM, which the worker ignores
    assert isinstance(h.sup.views()["train"].phase, Stopping)
    reconcile({"train": spec})  # wanted again while the stop is under way
    h.clock.advance(5.1)  # the grace is over: SIGKILL

    def restarted() -> dict[str, Any] | None:
        reconcile({"train": spec})
        report = h.report("train")
        return report if report is not None and report["pid"] != first["pid"] else None

    poll(restarted, "the job to start again")
    view = h.sup.views()["train"]
    assert (view.crash_restarts, view.change_restarts, type(view.phase)) == (0, 1, Running)
    assert not [a for a in seen if isinstance(a, GiveUp | ScheduleRestart)]
    assert [getattr(a, "cause", None) for a in seen if isinstance(a, Start)] == ["new", "change"]
    assert [(e.exit_code, e.crash) for e in h.exits] == [(137, False)]


# --- the job's state machine ----------------------------------------------------------


def test_a_move_the_transition_table_refuses_is_logged_and_changes_nothing(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, args=("--ignore-sigterm",)), "new"))
    h.wait_report("train")
    h.sup.apply(Stop("train", "assignment released", 30.0))
    h.sup.apply(ScheduleRestart("train", 5.0))  # a planner bug: no restart while stopping
    refused = [fields for name, fields in h.events if name == "illegal-transition"]
    assert refused == [{"job": "train", "phase": "stopping", "event": "schedule-restart"}]
    view = h.sup.views()["train"]
    assert isinstance(view.phase, Stopping)  # no restart timer: the move was refused
    assert h.sup.records()["train"]["state"] == "stopping"
