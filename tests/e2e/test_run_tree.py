"""``allocator run`` contains its command's whole tree, on the embedded store and a real etcd.

Whatever the command leaves behind (a background child, a ``setsid``
child) is stopped before the GPUs are released; a command that ignores
SIGTERM is killed after ``grace=``; Ctrl-Z stops the whole tree and the
hold stays alive while it is stopped; a SIGHUP ignored before ``run``
started (``nohup``) stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import pid_alive
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

HELD = ("host=node1", "count=1")


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test's command left: killed after the test, whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def _start(
    env: dict[str, str], runs: list[subprocess.Popen[bytes]], *words: str, **popen: Any
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", *words],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )
    runs.append(proc)
    return proc


def _pids(path: Path, count: int, leftovers: list[int]) -> list[int]:
    """The ``count`` pids the command wrote to ``path``, one a line."""

    def written() -> list[int] | None:
        lines = path.read_text().split() if path.exists() else []
        return [int(p) for p in lines] if len(lines) >= count else None

    pids = wait_for(f"the command to write {count} pid(s)", written)
    leftovers.extend(pids)
    return pids


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def _stays(what: str, probe: Callable[[], bool], seconds: float) -> None:
    """Check ``probe`` keeps holding for ``seconds`` (each look fails at once if it does not)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert probe(), f"{what} stopped holding"
        time.sleep(0.05)


def test_what_the_command_left_behind_is_stopped_before_the_gpus_are_released(
    applied: Cli, cli_env: dict[str, str], tmp_path: Path, leftovers: list[int]
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}"
    result = applied("run", "job=leaky", *HELD, "grace=2s", "--", "sh", "-c", script)
    assert result.code == 0, result.err
    background, detached = _pids(pids, 2, leftovers)
    # run returned: nothing of its command may still run (zombies are dead).
    assert not pid_alive(background) and not pid_alive(detached)
    assert applied("get", "job=leaky").code == 6


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(
    applied: Cli,
    cli_env: dict[str, str],
    runs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    leftovers: list[int],
) -> None:
    pids = tmp_path / "pids"
    script = f"trap '' TERM; sleep 300 & echo $! >> {pids}; wait; wait"
    proc = _start(cli_env, runs, "job=stubborn", *HELD, "grace=1s", "--", "sh", "-c", script)
    (child,) = _pids(pids, 1, leftovers)
    proc.send_signal(signal.SIGTERM)
    asked = time.monotonic()
    assert proc.wait(15) == 128 + signal.SIGKILL
    assert time.monotonic() - asked < 1 + 3
    assert not pid_alive(child)
    assert applied("get", "job=stubborn").code == 6


def test_ctrl_z_stops_the_whole_tree_and_keeps_the_hold_alive_until_fg(
    applied: Cli,
    cli_env: dict[str, str],
    runs: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    leftovers: list[int],
) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; wait"
    proc = _start(cli_env, runs, "job=paused", *HELD, "ttl=1s", "--", "sh", "-c", script)
    (child,) = _pids(pids, 1, leftovers)
    proc.send_signal(signal.SIGTSTP)
    wait_for("the command to stop", lambda: _state(child) == "T")
    wait_for("run to stop", lambda: _state(proc.pid) == "T")
    # Stopped for three TTLs: the GPUs are still this run's.
    _stays("the hold", lambda: applied("get", "job=paused").code == 0, 3.0)
    assert _state(child) == "T"
    proc.send_signal(signal.SIGCONT)
    wait_for("the command to go on", lambda: _state(child) not in ("T", ""))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 128 + signal.SIGINT
    assert not pid_alive(child)


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_sighup_ignored_before_run_started_stays_ignored(
    applied: Cli, cli_env: dict[str, str], runs: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    go, started = tmp_path / "go", tmp_path / "started"
    script = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; exit 7"
    proc = _start(cli_env, runs, "job=nohup", *HELD, "--", "sh", "-c", script,
                  preexec_fn=_ignore_sighup)  # fmt: skip
    wait_for("the command to start", started.exists)
    proc.send_signal(signal.SIGHUP)  # the terminal hangs up
    _stays("run", lambda: proc.poll() is None, 1.0)
    go.write_text("")
    assert proc.wait(15) == 7


def test_a_bad_grace_is_one_line_and_exit_2_with_nothing_held(applied: Cli) -> None:
    for grace in ("grace=soon", "grace=2h"):
        result = applied("run", "job=graceless", *HELD, grace, "--", "true")
        assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
        assert "grace=" in result.err and "Traceback" not in result.err
    assert applied("get", "job=graceless").code == 6
