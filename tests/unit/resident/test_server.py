"""The command server: one per installation, stops when idle, never serves code it did not load."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from allocator.resident import wire
from tests.support.waiting import wait_for
from tests.unit.resident.conftest import POLICY, Resident


def test_a_changed_source_file_is_never_served_a_new_server_takes_over(tmp_path: Path) -> None:
    package = tmp_path / "src" / "allocator"
    shutil.copytree(Path(wire.__file__).resolve().parents[1], package)
    runtime = Path(tempfile.mkdtemp(prefix="ar-"))
    resident = Resident(runtime, f"sqlite://{tmp_path / 'store.db'}", package)
    try:
        applied = resident.run("policy", "apply", str(POLICY), ALLOCATOR_SERVER="0")
        assert applied.returncode == 0, applied.stderr
        assert resident.run("get", "job=a").returncode == 6
        first = resident.wait_for_server()
        printable = package / "util" / "printable.py"
        printable.write_text(
            printable.read_text().replace(
                '    return printable(" ".join(message.split()))',
                '    return printable(" ".join(message.split())) + " (edited)"',
            )
        )
        assert "(edited)" in printable.read_text()
        edited = resident.run("get", "job=a")
        assert edited.returncode == 6
        assert edited.stderr.rstrip().endswith("(edited)")  # the new code ran, here
        wait_for("the old server to stop", lambda: not psutil.pid_exists(first), 30)
        assert resident.run("get", "job=a").returncode == 6
        second = resident.wait_for_server()
        assert second != first
        again = resident.run("get", "job=a")
        assert again.stderr.rstrip().endswith("(edited)")
    finally:
        resident.stop()
        shutil.rmtree(runtime, ignore_errors=True)


def test_an_idle_server_stops_and_removes_its_socket(resident: Resident) -> None:
    assert resident.run("get", "job=a", ALLOCATOR_SERVER_IDLE="1").returncode == 6
    server = resident.wait_for_server()
    wait_for("the idle server to stop", lambda: not psutil.pid_exists(server), 30)
    assert not resident.socket.exists()


def test_a_second_server_for_the_same_socket_leaves_the_first_alone(resident: Resident) -> None:
    assert resident.run("get", "job=a").returncode == 6
    server = resident.wait_for_server()
    second = subprocess.run(
        [sys.executable, "-m", "allocator.resident.server", str(resident.socket)],
        env=resident.env,
        timeout=60,
        check=False,
    )
    assert second.returncode == 0
    assert resident.server_pid() == server
    assert resident.run("get", "job=a").returncode == 6


def test_a_server_started_for_another_socket_refuses(resident: Resident) -> None:
    other = subprocess.run(
        [sys.executable, "-m", "allocator.resident.server", "/nonexistent/elsewhere.sock"],
        env=resident.env,
        timeout=60,
        check=False,
    )
    assert other.returncode == 2
    assert not resident.socket.exists()


def test_garbage_on_the_socket_runs_nothing_and_the_server_keeps_serving(
    resident: Resident,
) -> None:
    assert resident.run("set", "job=a", "gpus=0", "host=node1").returncode == 0
    resident.wait_for_server()
    for garbage in (b"\x00\x00\x00\x05hello", b"\xff\xff", b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(10)
            raw.connect(str(resident.socket))
            socket.send_fds(raw, [garbage or b"\x00"], [0, 1, 2])
            raw.shutdown(socket.SHUT_WR)
            assert raw.recv(16) == b""  # no "accepted", no exit status: nothing ran
    assert resident.run("get", "job=a").returncode == 0


def test_long_running_and_local_commands_are_never_served() -> None:
    assert {"agent", "serve", "demo", "doctor", "completion"}.isdisjoint(wire.SERVED)
    assert {"set", "get", "status", "release", "queue", "cancel", "submit", "run"} <= wire.SERVED
    assert {"run"} == wire.STARTS_PROCESSES


def test_the_server_socket_is_for_this_user_alone(resident: Resident) -> None:
    assert resident.run("get", "job=a").returncode == 6
    resident.wait_for_server()
    assert oct(resident.socket.stat().st_mode & 0o777) == "0o600"
    assert oct(resident.socket.parent.stat().st_mode & 0o777) == "0o700"
    assert resident.socket.parent.stat().st_uid == os.getuid()
