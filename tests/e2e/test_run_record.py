"""``run``'s command line as recorded: secrets masked wherever it shows, or no arguments."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.serve_harness import Served
from tests.support.waiting import wait_for

TOKEN = "tok-5e3cr3t-value"
PASSWORD = "pa55-word-in-url"
# The command waits until the test lets it end (no fixed sleep).
WAIT_FOR_FILE = "import os, sys, time\nwhile not os.path.exists(sys.argv[-1]): time.sleep(0.02)"


@pytest.fixture
def running(served: Served, tmp_path: Path) -> Iterator[tuple[Served, Path]]:
    """Start nothing yet; whatever ``run`` the test starts ends when the file appears."""
    done = tmp_path / "done"
    yield served, done
    done.touch()


def _start(served: Served, done: Path, *flags: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "allocator", "run", *flags, "job=probe", "host=node1"]
    script = done.with_name("wait.py")
    script.write_text(WAIT_FOR_FILE)
    argv += ["count=1", "--", sys.executable, str(script), "--token", TOKEN, f"--api-key={TOKEN}"]
    argv += [f"https://bob:{PASSWORD}@example.com/x", str(done)]  # the record keeps 200 characters
    env = {**served.env, "ALLOCATOR_HOST": "node1"}  # the policy's node1 is this machine
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _everywhere(served: Served) -> str:
    """Every place a command line shows: status, history (CLI) and serve's API."""
    texts = [
        served.cli("status", "-o", "json").out,
        served.cli("get", "job=probe", "-o", "json").out,
    ]
    texts.append(served.cli("history", "job=probe", "-o", "json").out)
    for path in ("/api/v1/status", "/api/v1/history"):
        code, body, _ = served.get(path)
        assert code == 200, body
        texts.append(body.decode())
    return "\n".join(texts)


def test_secrets_in_the_command_line_are_masked_in_status_history_and_the_api(
    running: tuple[Served, Path],
) -> None:
    served, done = running
    proc = _start(served, done)
    wait_for("the run to hold", lambda: served.cli("get", "job=probe").code == 0)
    shown = _everywhere(served)
    assert "--token ***" in shown and "--api-key=***" in shown and "bob:***@" in shown, shown
    done.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    shown = _everywhere(served)
    assert TOKEN not in shown and PASSWORD not in shown


def test_no_record_args_keeps_every_argument_out_of_the_record(
    running: tuple[Served, Path],
) -> None:
    served, done = running
    proc = _start(served, done, "--no-record-args")
    wait_for("the run to hold", lambda: served.cli("get", "job=probe").code == 0)
    shown = _everywhere(served)
    assert "arguments not recorded" in shown and "wait.py" not in shown, shown
    done.touch()
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert TOKEN not in _everywhere(served)
