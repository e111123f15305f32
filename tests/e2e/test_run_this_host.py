"""``run`` and ``lease()`` take GPUs of this machine only, and say why they wait in the queue.

The example policy's ``node1`` is this machine (``ALLOCATOR_HOST=node1``,
as the e2e environment sets it); ``node2`` is another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

# node1 has 4 GPUs; GPU 3 is reserved for eval-* jobs: 3 GPUs to take.
TAKE_ALL = ("host=node1", "count=3")


@pytest.fixture
def background(cli_env: dict[str, str]) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; killed if still running at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _start(cli_env: dict[str, str], started: list[subprocess.Popen[str]], *argv: str) -> Any:
    proc = subprocess.Popen(
        [sys.executable, *argv], env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    started.append(proc)
    return proc


def _queued(cli: Cli) -> list[str]:
    result = cli("queue", "host=node1", "-o", "json")
    assert result.code == 0, result.err
    return [line["job"] for line in json.loads(result.out)["queue"]]


def _nothing_written(cli: Cli) -> None:
    status = json.loads(cli("status", "-o", "json").out)
    assert [g for h in status["hosts"] for g in h["gpus"] if g["holder"]] == []
    entries = json.loads(cli("history", "-o", "json").out)["entries"]
    assert [e["action"] for e in entries] == ["policy-apply"]
    assert _queued(cli) == []


def test_run_on_another_host_is_exit_2_and_writes_nothing(applied: Cli) -> None:
    refused = applied("run", "job=elsewhere", "host=node2", "count=1", "--", "true")
    assert refused.code == 2 and refused.out == ""
    (line,) = refused.err.strip().splitlines()
    assert "host=node2 is not this machine (this is node1; set ALLOCATOR_HOST" in line
    waited = applied("run", "host=node2", "count=1", "--wait=5s", "--", "true")
    assert waited.code == 2 and "is not this machine" in waited.err
    _nothing_written(applied)


def test_without_allocator_host_this_machine_is_its_host_name(applied: Cli) -> None:
    if os.uname().nodename.split(".")[0] == "node1":
        pytest.skip("this machine is really called node1")
    refused = applied("run", "host=node1", "count=1", "--", "true", env={"ALLOCATOR_HOST": ""})
    assert refused.code == 2 and "host=node1 is not this machine" in refused.err
    _nothing_written(applied)


LEASE_ELSEWHERE = """
import allocator
from allocator.errors import InvalidInput
try:
    with allocator.lease(count=1, host="node2"):
        print("held")
except InvalidInput as refused:
    print(refused)
"""


def test_lease_on_another_host_is_refused(applied: Cli, cli_env: dict[str, str]) -> None:
    ran = subprocess.run([sys.executable, "-c", LEASE_ELSEWHERE], env=cli_env,
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("host=node2 is not this machine (this is node1;"), ran.stdout
    _nothing_written(applied)


def test_run_wait_says_once_why_it_waits(
    applied: Cli, cli_env: dict[str, str], background: list[subprocess.Popen[str]]
) -> None:
    assert applied("set", "job=blocker", *TAKE_ALL).code == 0
    run = _start(cli_env, background, "-m", "allocator", "run", "job=patient", "host=node1",
                 "count=1", "--wait=120s", "--", "true")  # fmt: skip
    wait_for("run in the queue", lambda: _queued(applied) == ["patient"], 60)
    assert applied("release", "job=blocker").code == 0
    _out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    waiting = [line for line in err.splitlines() if "waiting" in line]
    said = "allocator: note: queued and waiting for resources: "
    assert len(waiting) == 1 and waiting[0].startswith(said), err
    assert "blocker" in waiting[0], err


LEASE_WAITING = """
import logging, sys
import allocator
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
with allocator.lease(count=1, host="node1", job="notebook", wait="120s") as grant:
    print(grant.gpus, flush=True)
"""


def test_lease_logs_why_it_waits(
    applied: Cli, cli_env: dict[str, str], background: list[subprocess.Popen[str]]
) -> None:
    assert applied("set", "job=blocker", *TAKE_ALL).code == 0
    lease = _start(cli_env, background, "-c", LEASE_WAITING)
    wait_for("the lease in the queue", lambda: _queued(applied) == ["notebook"], 60)
    assert applied("release", "job=blocker").code == 0
    out, err = lease.communicate(timeout=60)
    assert lease.returncode == 0, err
    logged = [line for line in err.splitlines() if line.startswith("INFO:allocator.leasing:")]
    assert len(logged) == 1 and logged[0].startswith("INFO:allocator.leasing:waiting: "), err
    assert "blocker" in logged[0] and out.strip().startswith("("), (out, err)
