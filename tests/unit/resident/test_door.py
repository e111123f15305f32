"""The console script's door: one run of each command, through the server or here, same answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil

from allocator.resident import door
from tests.support.waiting import wait_for
from tests.unit.resident.conftest import POLICY, Resident


def _workers(server: int) -> list[psutil.Process]:
    """The server's workers: its children but the spare, the youngest, forked after each take."""
    try:
        children = sorted(psutil.Process(server).children(), key=lambda p: (p.create_time(), p.pid))
    except psutil.NoSuchProcess:
        return []
    return children[:-1]


def _first_line(process: subprocess.Popen[str], timeout: float = 30) -> str:
    """The first line ``process`` writes to stderr, within ``timeout`` seconds."""
    import select

    assert process.stderr is not None
    ready, _, _ = select.select([process.stderr], [], [], timeout)
    assert ready, "no line on stderr"
    return process.stderr.readline()


def _cold(resident: Resident, *words: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "allocator", *words],
        env={**resident.env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_first_command_runs_here_and_starts_a_server_for_the_next(resident: Resident) -> None:
    first = resident.run("set", "job=a", "gpus=0", "host=node1")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "a@node1: gpus 0\n"
    server = resident.wait_for_server()
    assert psutil.Process(server).cmdline()[1:4] == ["-P", "-m", "allocator.resident.server"]
    held = resident.run("get", "job=a")
    assert held.returncode == 0 and held.stdout.startswith("a@node1: gpus 0 (since ")
    assert resident.server_pid() == server  # the same server answered


def test_a_waiting_command_runs_in_the_servers_worker_and_dies_with_its_client(
    resident: Resident,
) -> None:
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    server = resident.wait_for_server()
    waiter = resident.start("set", "job=b", "gpus=0", "host=node1", "--wait=60s")
    try:
        worker = wait_for("the worker", lambda: _workers(server), timeout=30)[0]
        assert waiter.poll() is None
        waiter.kill()  # -9: no chance to tell the worker
        waiter.wait(timeout=10)
        wait_for("the worker to die with its client", lambda: not worker.is_running(), 15)
    finally:
        waiter.kill()
        waiter.communicate()
    assert resident.run("get", "job=b").returncode == 6  # it never took the GPU


def test_ctrl_c_reaches_the_worker_and_the_client_exits_130(resident: Resident) -> None:
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    server = resident.wait_for_server()
    waiter = resident.start("set", "job=b", "gpus=0", "host=node1", "--wait=60s")
    wait_for("the worker", lambda: _workers(server), timeout=30)
    waiter.send_signal(signal.SIGINT)
    _out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 130
    assert err.strip().endswith("interrupted"), err
    wait_for("no worker left", lambda: not _workers(server), 15)


def test_answers_exit_codes_and_errors_are_those_of_a_command_run_here(
    resident: Resident, tmp_path: Path
) -> None:
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    resident.wait_for_server()
    (tmp_path / "relative.yaml").write_text(POLICY.read_text())
    cases = [
        ("get", "job=a"),
        ("get", "job=nobody"),
        ("set", "job=b", "gpus=99", "host=node1"),
        ("set", "job=c", "gpus=0", "host=node1"),
        ("status", "-o", "json"),
        ("set", "--help"),
    ]
    for words in cases:
        served, here = resident.run(*words), _cold(resident, *words)
        assert (served.returncode, served.stdout, served.stderr) == (
            here.returncode,
            here.stdout,
            here.stderr,
        ), words
    assert [resident.run(*w).returncode for w in cases[:4]] == [0, 6, 2, 3]
    relative = subprocess.run(
        resident.argv("policy", "validate", "relative.yaml"),
        env=resident.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert relative.returncode == 0, relative.stderr  # the worker works in the client's cwd


def test_each_command_reads_its_own_clients_environment(resident: Resident, tmp_path: Path) -> None:
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    resident.wait_for_server()
    other = f"sqlite://{tmp_path / 'other.db'}"
    assert resident.run("policy", "apply", str(POLICY), ALLOCATOR_STORE=other).returncode == 0
    assert resident.run("get", "job=a", ALLOCATOR_STORE=other).returncode == 6
    assert resident.run("get", "job=a").returncode == 0


def test_turned_off_or_in_an_unsafe_directory_nothing_is_started(
    resident: Resident, tmp_path: Path
) -> None:
    off = resident.run("set", "job=a", "gpus=0", "host=node1", ALLOCATOR_SERVER="0")
    assert off.returncode == 0
    assert not any(resident.socket.parent.glob("server-*"))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f"allocator-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(shared / f"allocator-{os.getuid()}", 0o777)  # others could plant a socket here
    result = resident.run("get", "job=a", XDG_RUNTIME_DIR=str(shared))
    assert result.returncode == 0
    assert not any((shared / f"allocator-{os.getuid()}").iterdir())


def test_python_dash_m_allocator_never_starts_a_server(resident: Resident) -> None:
    assert _cold(resident, "set", "job=a", "gpus=0", "host=node1").returncode == 0
    assert not any(resident.socket.parent.glob("server-*"))


def test_the_installed_console_script_is_the_door() -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "allocator"]
    assert script.value == "allocator.resident.door:run"
    assert door.run.__module__ == "allocator.resident.door"


_SERVED_PROBE = """
import sys
from allocator.resident.door import main
sys.argv = ["allocator", *sys.argv[1:]]
code = main()
modules = sorted(sys.modules)
import json
print(json.dumps({"code": code, "modules": modules}), file=sys.stderr)
"""


def test_a_served_command_loads_the_door_alone(resident: Resident) -> None:
    """The served path's budget: the door and its wire, no library, no CLI, no typing."""
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    resident.wait_for_server()
    probe = subprocess.run(
        [sys.executable, "-P", "-c", _SERVED_PROBE, "get", "job=a"],
        env=resident.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(probe.stderr.strip().splitlines()[-1])
    assert report["code"] == 0
    assert probe.stdout.startswith("a@node1: gpus 0")
    ours = {m for m in report["modules"] if m.split(".")[0] == "allocator"}
    assert ours == {
        "allocator",
        "allocator.resident",
        "allocator.resident.door",
        "allocator.resident.wire",
        "allocator.util",
        "allocator.util.command_words",
    }
    heavy = {"msgspec", "h11", "typing", "argparse", "sqlite3", "enum", "selectors", "socket"}
    assert not heavy & set(report["modules"])
    assert len(report["modules"]) <= 100, len(report["modules"])


def test_help_wraps_at_the_clients_width(resident: Resident) -> None:
    assert resident.run("get", "job=a").returncode == 6
    resident.wait_for_server()
    narrow = resident.run("set", "--help", COLUMNS="50")
    assert narrow.returncode == 0
    assert narrow.stdout == _cold(resident, "set", "--help", COLUMNS="50").stdout
    wide = resident.run("set", "--help", COLUMNS="200")
    assert wide.stdout == _cold(resident, "set", "--help", COLUMNS="200").stdout
    assert len(wide.stdout.splitlines()) < len(narrow.stdout.splitlines())


@contextlib.contextmanager
def _waiting_in_a_worker(
    resident: Resident,
) -> Iterator[tuple[subprocess.Popen[str], psutil.Process]]:
    """A served ``set --wait`` behind job a's GPU, its worker running it (the client said go)."""
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    server = resident.wait_for_server()
    waiter = resident.start("set", "job=b", "gpus=0", "host=node1", "--wait=60s")
    try:
        worker = wait_for("the worker", lambda: _workers(server), timeout=30)[0]
        assert "waiting" in _first_line(waiter)  # the worker runs the command: it said go
        yield waiter, worker
    finally:
        waiter.kill()
        waiter.communicate()


def test_a_worker_killed_mid_command_is_exit_1_never_a_second_run(resident: Resident) -> None:
    with _waiting_in_a_worker(resident) as (waiter, worker):
        worker.kill()  # the OOM killer, say: the command may have done anything
        _out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 1
    assert err.strip().endswith("ALLOCATOR_SERVER=0 runs commands in this process)"), err
    assert resident.run("get", "job=b").returncode == 6  # and it was not run again here


def test_a_client_without_stdin_runs_its_command_here(resident: Resident) -> None:
    assert resident.run("get", "job=a").returncode == 6
    resident.wait_for_server()
    closed = subprocess.run(
        [*resident.argv("set", "job=a", "gpus=0", "host=node1")],
        env=resident.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        pass_fds=(),
        preexec_fn=lambda: os.close(0),
    )
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout == "a@node1: gpus 0\n"


def test_ctrl_z_stops_the_worker_with_its_client_and_fg_goes_on(resident: Resident) -> None:
    with _waiting_in_a_worker(resident) as (waiter, worker):
        client = psutil.Process(waiter.pid)
        waiter.send_signal(signal.SIGTSTP)
        stopped = psutil.STATUS_STOPPED
        wait_for("the worker to stop", lambda: worker.status() == stopped, 15)
        wait_for("the client to stop", lambda: client.status() == stopped, 15)
        waiter.send_signal(signal.SIGCONT)
        wait_for("the worker to go on", lambda: worker.status() != stopped, 15)
        assert resident.run("release", "job=a", "host=node1").returncode == 0
        _out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
    assert resident.run("get", "job=b").returncode == 0
