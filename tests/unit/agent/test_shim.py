"""The worker shim on its own: signals, status file, exit codes, and a stop with no agent left.

Each test runs ``python -I -S shim/main.py`` the way the agent does, in a new
session, with the dummy worker under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.kernel import procs
from allocator.agent.processes.launch import SHIM
from allocator.agent.processes.worker_status import read_shim_status
from allocator.agent.shim.main import EXIT_HANDOVER, EXIT_NO_STATUS, frame
from tests.support.supervision import DUMMY, alive, exists, kill_reported, poll, read_json

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux")


class Shim:
    """One shim process and the files it writes."""

    def __init__(self, tmp: Path, *worker_args: str, grace: float = 30.0) -> None:
        self.tmp = tmp
        self.status = tmp / "worker.status"
        self.out = tmp / "reports" / "train.0.json"
        command = [sys.executable, DUMMY, "--out", str(self.out), *worker_args]
        shim = [sys.executable, "-I", "-S", str(SHIM), str(self.status), str(grace)]
        self.proc = subprocess.Popen(
            [*shim, "-", "-", "-", "-", "--", *command],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )

    def report(self, suffix: str = "") -> dict[str, Any]:
        """The worker's report (or its child's, with suffix ``.child``), once written."""
        path = self.out.with_name(self.out.name + suffix)
        return dict(poll(lambda: read_json(path), f"the report {path.name}"))

    def wait(self) -> int:
        """The shim's exit code."""
        return self.proc.wait(timeout=30)


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:
        kill_reported(tmp_path)


def test_the_status_file_follows_the_worker_and_is_replaced_whole(tmp: Path) -> None:
    shim = Shim(tmp, "--exit-on-usr2", "--exit-code", "3")
    report = shim.report()
    running = read_shim_status(shim.status)
    assert running is not None
    assert (running.state, running.shim_pid, running.pid) == (
        "running",
        shim.proc.pid,
        report["pid"],
    )
    assert running.start_ticks == report["start_ticks"]
    os.kill(report["pid"], signal.SIGUSR2)
    assert shim.wait() == 3  # the shim ends with its worker's code
    status = json.loads(shim.status.read_text())
    assert (status["state"], status["exit_code"]) == ("exited", 3)
    assert shim.status.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp.iterdir() if p.name.endswith(".tmp")] == []


def test_a_worker_killed_by_a_signal_ends_with_128_plus_n(tmp: Path) -> None:
    shim = Shim(tmp)
    os.kill(shim.report()["pid"], signal.SIGKILL)
    assert shim.wait() == 128 + signal.SIGKILL
    status = read_shim_status(shim.status)
    assert status is not None and status.exit_code == 137


def test_signals_other_than_a_stop_go_to_the_main_process_only(tmp: Path) -> None:
    shim = Shim(tmp, "--spawn-child")
    report = shim.report()
    os.kill(shim.proc.pid, signal.SIGUSR1)  # an on_change signal: the dummy dies of it
    assert shim.wait() == 128 + signal.SIGUSR1
    assert not exists(report["child_pid"])  # its child then went as what was left behind


def test_a_stop_goes_to_every_process_of_the_tree(tmp: Path) -> None:
    shim = Shim(tmp, "--spawn-child", "--setsid-child")
    report, child = shim.report(), shim.report(".child")
    assert child["sid"] != report["sid"]
    os.kill(shim.proc.pid, signal.SIGTERM)
    assert shim.wait() == 128 + signal.SIGTERM
    assert not exists(report["pid"]) and not exists(child["pid"])


_SHORT_LIVED_AGENT = """
import subprocess, sys, time
from pathlib import Path
status = Path(sys.argv[1])
shim = subprocess.Popen(
    sys.argv[2:], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
)
while not status.exists():  # it has started its worker: now its agent dies
    time.sleep(0.01)
print(shim.pid)
"""


def test_a_shim_finishes_a_stop_on_its_own_when_its_agent_is_gone(tmp: Path) -> None:
    status = tmp / "worker.status"
    out = tmp / "reports" / "train.0.json"
    worker = [sys.executable, DUMMY, "--out", str(out), "--spawn-child", "--ignore-sigterm"]
    shim = [sys.executable, "-I", "-S", str(SHIM), str(status), "0.1", "-", "-", "-", "-"]
    started = subprocess.run(
        [sys.executable, "-c", _SHORT_LIVED_AGENT, str(status), *shim, "--", *worker],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout)
    report = dict(poll(lambda: read_json(out), "the worker's report"))
    os.kill(pid, signal.SIGTERM)  # nobody is left to escalate: the shim must
    poll(lambda: not alive(pid), "the shim to finish the stop")
    reap_orphan(pid)
    assert not exists(report["pid"]) and not exists(report["child_pid"])
    ended = read_shim_status(status)
    assert ended is not None and ended.exit_code == 128 + signal.SIGKILL


def reap_orphan(pid: int) -> None:
    """Reap ``pid`` if it was reparented to this process (a subreaper); init does otherwise."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_a_shim_killed_with_its_group_leaves_no_worker_behind(tmp: Path) -> None:
    shim = Shim(tmp, "--spawn-child")
    report = shim.report()
    os.killpg(shim.proc.pid, signal.SIGKILL)
    assert shim.wait() == -signal.SIGKILL
    poll(lambda: not alive(report["pid"]) and not alive(report["child_pid"]), "the tree to go")


@pytest.mark.parametrize(
    ("arguments", "words"),
    [([], "bad arguments"), (["s", "x", "-", "-", "-", "-", "--", "true"], "bad arguments")],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp: Path, arguments: list[str], words: str) -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SHIM), *arguments], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"allocator-shim: {words}")
    assert len(done.stderr.splitlines()) == 1


def test_the_shim_is_the_subreaper_of_its_tree(tmp: Path) -> None:
    shim = Shim(tmp, "--spawn-child", "--setsid-child", "--stubborn-child", grace=1.0)
    report, child = shim.report(), shim.report(".child")
    os.kill(report["pid"], signal.SIGKILL)  # the child is orphaned: it comes to the shim

    def parent_of_child() -> int | None:
        stat = procs.read_stat(child["pid"])
        return stat.ppid if stat is not None else None

    poll(lambda: parent_of_child() == shim.proc.pid, "the orphan to be reparented to the shim")
    assert shim.wait() == 137  # the worker's code, once what it left behind was gone too
    assert not exists(child["pid"])


def _cold_shim(tmp: Path, sent: bytes) -> subprocess.CompletedProcess[str]:
    """A cold shim whose agent wrote ``sent`` to its environment pipe, then died.

    Its worker, if it runs, reports and exits at once.
    """
    out = tmp / "reports" / "train.0.json"
    read, write = os.pipe()
    command = [sys.executable, "-I", "-S", str(SHIM), str(tmp / "worker.status"), "30"]
    proc = subprocess.Popen(
        [
            *command,
            "-",
            "-",
            "-",
            str(read),
            "--",
            sys.executable,
            DUMMY,
            "--out",
            str(out),
            "--exit-after",
            "0",
        ],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(read,),
    )
    os.close(read)
    os.write(write, sent)
    os.close(write)  # as the kernel does when the agent is killed
    _, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.parametrize("kept", [0, 5, 8, 20, -1])
def test_a_cold_shim_cut_off_in_the_middle_of_its_hand_over_starts_nothing(
    tmp: Path, kept: int
) -> None:
    """No worker may run with part of its environment (no CUDA_VISIBLE_DEVICES: every GPU)."""
    whole = frame(b"PATH=/usr/bin:/bin\0CUDA_VISIBLE_DEVICES=3\0ALLOCATOR_JOB=train")
    done = _cold_shim(tmp, whole[:kept])
    assert done.returncode == EXIT_HANDOVER
    assert "incomplete hand-over" in done.stderr
    assert not (tmp / "reports" / "train.0.json").exists()
    status = read_shim_status(tmp / "worker.status")
    assert status is not None
    assert (status.state, status.exit_code, status.pid) == ("failed", EXIT_HANDOVER, 0)


def test_a_cold_shim_handed_a_whole_frame_runs_the_worker_with_exactly_it(tmp: Path) -> None:
    env = b"PATH=" + os.environ["PATH"].encode() + b"\0LANG=C.UTF-8\0CUDA_VISIBLE_DEVICES=3"
    done = _cold_shim(tmp, frame(env + b"\0\0status.job=train\0status.boot_id=b1"))
    assert done.returncode == 0, done.stderr
    report = read_json(tmp / "reports" / "train.0.json")
    assert report is not None
    assert report["env"] == {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    status = read_shim_status(tmp / "worker.status")
    assert status is not None
    assert (status.state, status.job, status.boot_id) == ("exited", "train", "b1")


def test_a_shim_that_cannot_write_its_status_file_starts_nothing(tmp: Path) -> None:
    """No later agent could find that worker (nor learn how it ended): it must not run."""
    out = tmp / "reports" / "train.0.json"
    status = tmp / "no-such-directory" / "worker.status"
    command = [sys.executable, "-I", "-S", str(SHIM), str(status), "30", "-", "-", "-", "-"]
    done = subprocess.run(
        [*command, "--", sys.executable, DUMMY, "--out", str(out), "--exit-after", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_NO_STATUS
    assert "cannot write status file" in done.stderr
    assert not out.exists()


def test_a_shim_with_a_stop_command_runs_it_on_a_stop_instead_of_signalling(tmp: Path) -> None:
    """A container's stop is its engine's (``ENGINE stop -t GRACE NAME``), not a SIGTERM."""
    from allocator.agent.processes.container_launch import STOP_SEPARATOR, STOP_SETTING
    from allocator.agent.processes.launch import start_under_shim

    pidfile, marker = tmp / "worker.pid", tmp / "stopped"
    worker = (
        "trap 'exit 3' TERM; trap 'exit 5' USR1; echo $$ > worker.pid.tmp; "
        "mv worker.pid.tmp worker.pid; while :; do sleep 0.05; done"
    )
    stop = ["/bin/sh", "-c", f'echo "$0 $1" > {marker}; kill -USR1 $(cat {pidfile})', "-t", "7"]
    launch = start_under_shim(
        ["/bin/sh", "-c", worker],
        {"PATH": os.environ["PATH"]},
        cwd=str(tmp),
        log_path=tmp / "worker.log",
        header="test",
        status_path=tmp / "worker.status",
        grace=7.0,
        cgroup=None,
        run_as=None,
        settings={STOP_SETTING: STOP_SEPARATOR.join(stop)},
    )
    assert launch.popen is not None
    poll(lambda: pidfile.exists(), "the worker's pid file")
    os.kill(launch.pid, signal.SIGTERM)
    assert launch.popen.wait(timeout=30) == 5  # the stop command ended it, not a SIGTERM
    assert marker.read_text() == "-t 7\n"
    status = read_shim_status(tmp / "worker.status")
    assert status is not None and (status.state, status.exit_code) == ("exited", 5)
