"""``run`` through the command server: the same command, signals and kills as a run here.

The command's parent says where it ran: a served run's is the server's
worker (a child of the server), a run here's is the client itself.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for
from tests.unit.resident.conftest import Resident

#: What the command reports of itself: where it runs and what it inherited.
_REPORT = """
import json, os, resource, signal, sys, time
print(json.dumps({
    "ppid": os.getppid(),
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "job": os.environ.get("ALLOCATOR_JOB"),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    "hup_ignored": signal.getsignal(signal.SIGHUP) == signal.SIG_IGN,
    "cwd": os.getcwd(),
    "umask": os.umask(0),
}), flush=True)
flag = sys.argv[1] if len(sys.argv) > 1 else ""
while flag and not os.path.exists(flag):  # till the test says so
    time.sleep(0.02)
"""


def _served_ready(resident: Resident) -> int:
    """Start the server (a first command starts it) and wait till it listens; its pid."""
    assert resident.run("get", "job=nothing").returncode == 6
    return resident.wait_for_server()


def _start_run(
    resident: Resident, *words: str, before: Callable[[], None] | None = None, cwd: Path
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        resident.argv("run", *words),
        env=resident.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=before,
    )


def _report(process: subprocess.Popen[str]) -> dict[str, object]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.stderr else ""
    found: dict[str, object] = json.loads(line)
    return found


def _finished(process: subprocess.Popen[str]) -> int:
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return process.returncode


def _ran_in_a_worker_of(server: int, report: dict[str, object]) -> bool:
    parent = report["ppid"]
    assert isinstance(parent, int)
    return psutil.Process(parent).ppid() == server


def test_a_served_run_gets_what_a_run_here_gets(resident: Resident, tmp_path: Path) -> None:
    server = _served_ready(resident)
    command = ("--", sys.executable, "-c", _REPORT)

    def lower_nofile() -> None:
        os.umask(0o027)
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(7)[1]))

    done = str(tmp_path / "done")
    served = _start_run(
        resident, "job=r1", "count=1", *command, done, before=lower_nofile, cwd=tmp_path
    )
    report = _report(served)
    assert _ran_in_a_worker_of(server, report)
    Path(done).touch()
    assert _finished(served) == 0
    here = subprocess.run(
        [sys.executable, "-m", "allocator", "run", "job=r1", "count=1", *command, done],
        env=resident.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        preexec_fn=lower_nofile,
    )
    assert here.returncode == 0, here.stderr
    cold = json.loads(here.stdout)
    assert cold["ppid"] != report["ppid"]
    assert {**report, "ppid": 0} == {**cold, "ppid": 0}
    assert report["gpus"] == "0" and report["nofile"] == 200 and report["umask"] == 0o027
    assert report["cwd"] == str(tmp_path) and report["job"] == "r1"
    assert resident.run("get", "job=r1").returncode == 6  # given back


def test_a_client_killed_outright_stops_the_served_tree_and_gives_the_gpus_back_at_once(
    resident: Resident, tmp_path: Path
) -> None:
    """Not when the lease expires (60s here): the worker outlives its client and cleans up."""
    server = _served_ready(resident)
    leaves = (
        "import subprocess, sys, time;"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True);"
        f"exec(compile({_REPORT!r}.replace('\"ppid\": os.getppid(),',"
        " '\"ppid\": os.getppid(), \"left\": child.pid,'), 'r', 'exec'))"
    )
    client = _start_run(
        resident, "job=k1", "count=1", "ttl=60s", "grace=2s", "--",
        sys.executable, "-c", leaves, str(tmp_path / "never"), cwd=tmp_path,
    )  # fmt: skip
    report = _report(client)
    assert _ran_in_a_worker_of(server, report)
    left = report["left"]
    assert isinstance(left, int) and psutil.pid_exists(left)
    client.kill()
    client.communicate(timeout=30)
    wait_for("the setsid child to be stopped", lambda: not _alive(left), timeout=30)
    wait_for(
        "the GPUs to be given back",
        lambda: resident.run("get", "job=k1").returncode == 6,
        timeout=30,
    )


def _status_is(pid: int, status: str) -> bool:
    return bool(psutil.Process(pid).status() == status)


def _hup_ignored() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_ctrl_z_stops_the_served_tree_and_fg_resumes_it(resident: Resident, tmp_path: Path) -> None:
    server = _served_ready(resident)
    client = _start_run(
        resident, "job=z1", "count=1", "--", sys.executable, "-c", _REPORT,
        str(tmp_path / "done"), cwd=tmp_path,
    )  # fmt: skip
    try:
        report = _report(client)
        assert _ran_in_a_worker_of(server, report)
        worker = psutil.Process(report["ppid"])  # type: ignore[arg-type]
        command = worker.children()[0]
        stopped = psutil.STATUS_STOPPED
        client.send_signal(signal.SIGTSTP)
        for name, pid in (("command", command.pid), ("worker", worker.pid), ("client", client.pid)):
            wait_for(f"the {name} to stop", partial(_status_is, pid, stopped), 30)
        client.send_signal(signal.SIGCONT)
        wait_for("the command to go on", lambda: command.status() != stopped, 30)
        (tmp_path / "done").touch()
        assert _finished(client) == 0
    finally:
        client.kill()
        client.communicate(timeout=60)
    assert resident.run("get", "job=z1").returncode == 6


def test_a_client_killed_while_its_served_run_is_stopped_gives_the_gpus_back(
    resident: Resident, tmp_path: Path
) -> None:
    """The worker's own lookout is stopped with it: another process continues it."""
    server = _served_ready(resident)
    client = _start_run(
        resident, "job=z2", "count=1", "ttl=60s", "grace=2s", "--", sys.executable, "-c",
        _REPORT, str(tmp_path / "never"), cwd=tmp_path,
    )  # fmt: skip
    report = _report(client)
    assert _ran_in_a_worker_of(server, report)
    worker = psutil.Process(report["ppid"])  # type: ignore[arg-type]
    command = worker.children()[0]
    client.send_signal(signal.SIGTSTP)
    wait_for("the worker to stop", lambda: worker.status() == psutil.STATUS_STOPPED, 30)
    client.kill()
    client.communicate(timeout=60)
    wait_for("the stopped command to be ended", lambda: not _alive(command.pid), 30)
    wait_for(
        "the GPUs to be given back",
        lambda: resident.run("get", "job=z2").returncode == 6,
        timeout=30,
    )
    wait_for("the worker to end", lambda: not _alive(worker.pid), 30)


def test_a_nohup_client_keeps_sighup_ignored_for_the_command(
    resident: Resident, tmp_path: Path
) -> None:
    server = _served_ready(resident)
    client = _start_run(
        resident, "job=h1", "count=1", "--", sys.executable, "-c", _REPORT,
        str(tmp_path / "done"), cwd=tmp_path,
        before=_hup_ignored,
    )  # fmt: skip
    report = _report(client)
    assert _ran_in_a_worker_of(server, report)
    assert report["hup_ignored"] is True
    client.send_signal(signal.SIGHUP)  # the terminal hung up: nohup's command goes on
    (tmp_path / "done").touch()
    assert _finished(client) == 0


def _nicer() -> None:
    os.nice(3)


def _likelier_oom_victim() -> None:
    with open("/proc/self/oom_score_adj", "w") as adj:  # raising it needs no privilege
        adj.write("100")


@pytest.mark.parametrize("differ", [_nicer, _likelier_oom_victim], ids=["nice", "oom_score_adj"])
def test_a_client_the_worker_cannot_be_runs_it_in_its_own_process(
    resident: Resident, tmp_path: Path, differ: Callable[[], None]
) -> None:
    _served_ready(resident)
    client = _start_run(
        resident, "job=d1", "count=1", "--", sys.executable, "-c", _REPORT,
        cwd=tmp_path, before=differ,
    )  # fmt: skip
    report = _report(client)
    assert _finished(client) == 0
    assert report["ppid"] == client.pid  # run here: the command is the client's own child
