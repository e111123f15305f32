"""An agent restarted after ``kill -9`` adopts its workers: no duplicates, real exit codes.

The agent that gets killed is a supervisor in another process (the
``other_agent`` fixture); the harness's supervisor plays the restarted
agent. The harness made this test process a child subreaper, so the dead
agent's shims come to it; where a test needs the init system's behaviour
(reaping every orphan at once, so no ``/proc`` entry is left to read), it
reaps them itself with :func:`reap_like_init`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.kernel import procs
from allocator.agent.planning.exit_codes import UNKNOWN_EXIT
from allocator.agent.planning.job_phase import BackingOff, Stopping
from allocator.agent.planning.reconcile import plan
from allocator.agent.planning.types import Finish, ScheduleRestart, Start
from tests.support import supervision
from tests.support.supervision import (
    DUMMY,
    Harness,
    OtherAgent,
    alive,
    exists,
    job_spec,
    poll,
    processes_running,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux /proc")
make_harness = supervision.make_harness
h = supervision.h
other_agent = supervision.other_agent


def reap_like_init(pids: list[int]) -> None:
    """Reap these processes once they have exited, as init reaps the orphans it inherits."""

    def reaped() -> bool:
        for pid in list(pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not ours (any more)
            if done:
                pids.remove(pid)
        return not pids

    poll(reaped, "the orphans to end and be reaped")


def _state(h: Harness) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((h.tmp / "state.json").read_text())
    return data


def _save_state(h: Harness, data: dict[str, Any]) -> None:
    (h.tmp / "state.json").write_text(json.dumps(data))


def test_adopt_after_kill_9_takes_over_live_workers_without_duplicates(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [[], []]})
    reports = [h.wait_report("train", 0), h.wait_report("train", 1)]
    agent.kill_9()  # h's supervisor already made this process the subreaper for orphans
    report = h.sup.adopt()
    assert report.adopted == ("train",) and report.stale == ()
    assert [w.outcome for w in report.workers] == ["adopted", "adopted"]
    view = h.sup.views()["train"]
    assert (view.fingerprint, view.alive, view.exit_codes) == ("fp-train", 2, (None, None))
    assert h.pids("train") == [r["pid"] for r in reports]
    h.sup.apply(Start("train", job_spec(h.tmp), "new"))  # a duplicate start is refused
    assert "start-refused" in h.event_names()
    for index in (0, 1):
        out = h.tmp / "reports" / f"train.{index}.json"
        assert processes_running(out) == [reports[index]["pid"]]
    h.sup.stop_all(grace=5.0)
    assert not any(alive(r["pid"]) for r in reports)
    assert h.sup.views()["train"].exit_codes == (143, 143)


def test_adopted_worker_that_is_not_our_child_is_watched_through_its_shim(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [[]]})
    pid = h.wait_report("train")["pid"]
    assert h.sup.adopt().adopted == ("train",)  # the other agent still lives: it is the parent
    os.kill(pid, signal.SIGKILL)
    h.until(lambda: h.sup.views()["train"].exit_codes[0] is not None, "the exit")
    assert h.sup.views()["train"].exit_codes == (137,)  # from the shim's status file
    assert h.sup.views()["train"].alive == 1  # the other agent has not reaped the shim yet
    assert [e.crash for e in h.exits] == [True]
    agent.kill_9()  # now the shim's zombie comes to us (subreaper) and is reaped
    h.until(lambda: h.sup.views()["train"].alive == 0, "the tree to be gone")


def test_exit_codes_of_workers_that_end_while_no_agent_runs_are_not_lost(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent(
        {"ok": [["--exit-on-usr2"]], "bad": [["--exit-on-usr2", "--exit-code", "3"]]}
    )
    reports = {job: h.wait_report(job) for job in ("ok", "bad")}
    agent.kill_9()
    for report in reports.values():
        os.kill(report["pid"], signal.SIGUSR2)  # they end while no agent runs ...
    reap_like_init([p for r in reports.values() for p in (r["pid"], r["ppid"])])  # ... reaped
    adopted = h.sup.adopt()
    assert sorted(adopted.ended) == ["bad", "ok"]
    h.until(lambda: len(h.exits) == 2, "both exits to be read")
    assert sorted((e.job, e.exit_code, e.crash) for e in h.exits) == [
        ("bad", 3, True),
        ("ok", 0, False),
    ]
    desired = {job: replace(job_spec(h.tmp, job), fingerprint=f"fp-{job}") for job in ("ok", "bad")}
    actions = plan(desired, h.sup.views(), h.clock())
    # The clean exit is finished, never run again; the crash follows the crash rules.
    assert [(type(a), a.job) for a in actions] == [(ScheduleRestart, "bad"), (Finish, "ok")]
    assert h.sup.records()["ok"]["state"] == "exited"
    for action in actions:
        h.sup.apply(action)
    assert h.sup.records()["ok"]["state"] == "finished"
    assert h.sup.records()["ok"]["message"] == "finished (exit 0)"
    assert h.sup.records()["bad"]["last_exit"] == 3


def test_a_stop_under_way_when_the_agent_died_is_finished_and_is_not_a_crash(
    make_harness: Callable[..., Harness], other_agent: Callable[..., OtherAgent]
) -> None:
    h = make_harness(real_clock=True)  # the stop's deadline is on the real monotonic clock
    agent = other_agent({"train": [["--ignore-sigterm"]]}, grace=60)
    report = h.wait_report("train")
    agent.stop("train", 0.3)  # SIGTERM sent, SIGKILL due in 0.3 s ...
    agent.kill_9()  # ... but the agent that was to send it is gone
    assert h.sup.adopt().adopted == ("train",)
    assert isinstance(h.sup.views()["train"].phase, Stopping)
    h.until(lambda: h.sup.views()["train"].alive == 0, "the stop to be finished")
    assert not alive(report["pid"])
    assert [(e.exit_code, e.crash) for e in h.exits] == [(137, False)]
    desired = {"train": replace(job_spec(h.tmp), fingerprint="fp-train")}
    assert [(type(a), getattr(a, "cause", None)) for a in plan(desired, h.sup.views(), 0)] == [
        (Start, "change")
    ]


def test_a_job_the_agent_died_launching_is_restarted_whole(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [[]]})
    report = h.wait_report("train")
    agent.kill_9()
    state = _state(h)
    launched = state["jobs"]["train"]["workers"][0]
    launched.update(pid=0, pgid=0, start_ticks=None)  # saved before its launch, not after
    unborn = dict(launched, index=1, status_path=str(h.tmp / "workers" / "never.status"))
    state["jobs"]["train"]["workers"].append(unborn)  # this one never got as far
    _save_state(h, state)
    adopted = h.sup.adopt()
    assert [(w.index, w.outcome) for w in adopted.workers] == [
        (0, "adopted"),  # found through its shim's status file
        (1, "never-started"),
    ]
    assert adopted.workers[0].pid == report["ppid"]
    h.until(lambda: h.sup.views()["train"].alive == 0, "the half-started job to be stopped")
    assert not alive(report["pid"])
    assert not any(e.crash for e in h.exits)
    desired = {"train": replace(job_spec(h.tmp), fingerprint="fp-train")}
    actions = plan(desired, h.sup.views(), h.clock())
    assert [(type(a), getattr(a, "cause", None)) for a in actions] == [(Start, "change")]


def test_adopt_never_touches_a_process_that_reused_a_recorded_pid(
    make_harness: Callable[..., Harness], other_agent: Callable[..., OtherAgent]
) -> None:
    h = make_harness(cgroups=False)  # a cgroup would prove the process is the worker's
    agent = other_agent({"train": [[]]}, cgroups=False)
    report = h.wait_report("train")
    agent.kill_9()
    state = _state(h)
    state["jobs"]["train"]["workers"][0]["start_ticks"] += 1  # as if the pid were reused
    _save_state(h, state)
    assert [w.outcome for w in h.sup.adopt().workers] == ["ended"]
    h.until(lambda: h.sup.views()["train"].alive == 0, "the recorded worker to count as gone")
    assert h.sup.views()["train"].exit_codes == (UNKNOWN_EXIT,)
    assert alive(report["pid"]) and alive(report["ppid"])  # someone else's now: left alone


def test_orphans_of_a_shim_killed_while_no_agent_ran_are_stopped(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [["--spawn-child"]]})
    report = h.wait_report("train")
    agent.kill_9()
    os.kill(report["ppid"], signal.SIGKILL)  # the shim; the worker dies with it ...
    poll(lambda: not alive(report["pid"]), "the worker to die with its shim")
    assert alive(report["child_pid"])  # ... but its child is an orphan now
    assert [w.outcome for w in h.sup.adopt().workers] == ["ended"]
    h.until(lambda: h.sup.views()["train"].exit_codes[0] is not None, "the exit")
    assert h.sup.views()["train"].alive == 1
    desired = {"train": replace(job_spec(h.tmp), fingerprint="fp-train")}
    for action in plan(desired, h.sup.views(), h.clock()):  # a crash with workers left: stop
        h.sup.apply(action)
    h.clock.advance(1.0)
    h.until(lambda: h.sup.views()["train"].alive == 0, "the orphan to be stopped")
    assert not exists(report["child_pid"])


def test_adopt_survives_a_bad_state_file_and_keeps_finished_jobs(h: Harness) -> None:
    state_path = h.tmp / "state.json"
    state_path.write_text("{not json")
    assert h.sup.adopt().adopted == ()
    assert "state-unreadable" in h.event_names()
    h.sup.apply(Start("train", job_spec(h.tmp, args=("--exit-after", "0")), "new"))
    h.until(lambda: h.sup.views()["train"].alive == 0, "the worker to exit")
    state = _state(h)
    state["jobs"]["broken"] = {"spec": {}}
    _save_state(h, state)
    second = supervision.Supervisor(
        h.tmp / "logs", state_path, base_env=supervision.AGENT_ENV, clock=h.clock, logger=_quiet
    )
    report = second.adopt()
    assert (report.adopted, report.stale, report.ended) == ((), ("broken",), ("train",))
    assert second.records()["train"]["state"] == "exited"  # kept: an exit 0 is never re-run
    actions = plan({"train": job_spec(h.tmp, args=("--exit-after", "0"))}, second.views(), 0)
    assert [type(a) for a in actions] == [Finish]  # finished: no Start


def _quiet(name: str, fields: dict[str, Any]) -> None:
    """A logger that drops everything."""


def test_a_state_file_from_before_shims_is_still_adopted(h: Harness) -> None:
    """Workers started by an older agent (no shim) are adopted and stopped as before."""
    out = h.tmp / "reports" / "old.0.json"
    old = subprocess.Popen(
        [sys.executable, DUMMY, "--out", str(out), "--spawn-child"], start_new_session=True
    )
    report = h.wait_report("old")
    stat = procs.read_stat(old.pid)
    assert stat is not None
    entry = {
        "fingerprint": "fp-old",
        "spec": {
            "job": "old",
            "fingerprint": "fp-old",
            "on_change": "restart",
            "grace_seconds": 1.0,
            "max_restarts": 3,
            "backoff_base": 1.0,
            "backoff_max": 30.0,
            "gpus": [0],
            "device": "cuda",
        },
        "workers": [
            {
                "index": 0,
                "argv": ["x"],
                "env": {},
                "gpus": [0],
                "device": "cuda",
                "pid": old.pid,
                "pgid": old.pid,
                "start_ticks": stat.start_ticks,
            }
        ],
        "started_at": 0.0,
    }
    _save_state(h, {"schema_version": 1, "jobs": {"old": entry}})
    assert [w.outcome for w in h.sup.adopt().workers] == ["adopted"]
    assert h.pids("old") == [old.pid]
    h.sup.stop_all(grace=5.0)
    assert h.sup.views()["old"].exit_codes == (143,)
    assert h.sup.records()["old"]["state"] == "stopped"
    assert not alive(old.pid) and not alive(report["child_pid"])
    old.wait(timeout=10)  # reaped by the supervisor already: Popen just learns it


def test_state_file_is_private_and_names_the_shim_and_its_status_file(h: Harness) -> None:
    h.sup.apply(Start("train", job_spec(h.tmp, gpus=(1,)), "new"))
    report = h.wait_report("train")
    h.pids("train")
    path = h.tmp / "state.json"
    assert path.stat().st_mode & 0o777 == 0o600
    worker = _state(h)["jobs"]["train"]["workers"][0]
    shim = procs.read_stat(report["ppid"])
    assert shim is not None
    assert (worker["pid"], worker["pgid"], worker["start_ticks"]) == (
        shim.pid,
        shim.pid,
        shim.start_ticks,
    )
    assert (worker["main_pid"], worker["main_ticks"]) == (report["pid"], report["start_ticks"])
    status = json.loads(Path(worker["status_path"]).read_text())
    assert (status["shim_pid"], status["pid"], status["state"]) == (
        shim.pid,
        report["pid"],
        "running",
    )
    assert worker["env"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_a_worker_no_state_entry_names_is_adopted_from_its_status_file(
    h: Harness, other_agent: Callable[..., OtherAgent]
) -> None:
    agent = other_agent({"train": [[]]})
    report = h.wait_report("train")
    agent.kill_9()
    (h.tmp / "state.json").unlink()  # the record of it is lost
    leftover = h.tmp / "workers" / "old.0.cafe.status"
    leftover.write_text('{"shim_pid": 999999999, "state": "exited", "exit_code": 0}')
    assert h.sup.adopt().adopted == ("train",)
    assert "unknown-worker-stopped" not in h.event_names()
    assert h.pids("train") == [report["pid"]]  # the same worker, still running
    desired = {"train": replace(job_spec(h.tmp), fingerprint="fp-train")}
    assert plan(desired, h.sup.views(), h.clock()) == []  # kept: never started twice
    assert not leftover.exists()  # what nothing runs for any more is cleared away


def test_the_state_file_records_the_phase_and_reads_an_older_agents_flags(h: Harness) -> None:
    args = ("--exit-after", "0", "--exit-code", "3")
    h.sup.apply(Start("train", job_spec(h.tmp, args=args), "new"))
    h.until(lambda: h.sup.views()["train"].alive == 0, "the crash")
    entry = _state(h)["jobs"]["train"]
    assert (entry["phase"], entry["crashed"], entry["stopping"]) == ("crashed", True, False)
    # What an agent before phases wrote: flags only, and a restart scheduled after the crash.
    del entry["phase"]
    entry["next_restart_at"] = 1000.0
    _save_state(h, {"schema_version": 1, "jobs": {"train": entry}})
    second = supervision.Supervisor(
        h.tmp / "logs",
        h.tmp / "state.json",
        base_env=supervision.AGENT_ENV,
        clock=h.clock,
        logger=_quiet,
    )
    assert second.adopt().ended == ("train",)
    assert second.records()["train"]["state"] == "backoff"
    assert second.views()["train"].phase == BackingOff(1000.0)
    assert _state(h)["jobs"]["train"]["phase"] == "backoff"
