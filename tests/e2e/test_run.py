"""``allocator run`` with real processes, on the embedded store and a real etcd.

The command sees exactly its GPUs; its exit status comes back; Ctrl-C and
SIGKILL of ``run`` both free the GPUs (SIGKILL within the lease's TTL);
``--wait`` starts the moment the GPUs are released; ``usage`` adds up what
history recorded.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agent_harness import pid_alive
from tests.e2e.conftest import Cli
from tests.support.waiting import wait_for

# node1 has 4 GPUs; GPU 3 is reserved for eval-* jobs: 3 GPUs to take.
TAKE_ALL = ("host=node1", "count=3")
SHOW_ENV = "import os, json; print(json.dumps({k: v for k, v in os.environ.items()}))"


@pytest.fixture
def popen(cli_env: dict[str, str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``run`` processes a test starts in the background; killed (with their groups) after."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)  # reaps it and closes its pipes


def _start(cli_env: dict[str, str], procs: list[subprocess.Popen[bytes]], *words: str) -> Any:
    proc = subprocess.Popen(
        [sys.executable, "-m", "allocator", "run", *words],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    procs.append(proc)
    return proc


def _holds(cli: Cli, job: str) -> bool:
    return cli("get", f"job={job}").code == 0


def _queued(cli: Cli) -> list[str]:
    """The jobs waiting on node1, in queue order (a waiter refused once has its entry there)."""
    result = cli("queue", "host=node1", "-o", "json")
    assert result.code == 0, result.err
    return [line["job"] for line in json.loads(result.out)["queue"]]


def _last_release(cli: Cli, job: str) -> dict[str, object]:
    result = cli("history", f"job={job}", "-o", "json")
    assert result.code == 0, result.err
    releases = [e for e in json.loads(result.out)["entries"] if e["action"] == "release"]
    assert releases, result.out
    entry: dict[str, object] = releases[0]
    return entry


def test_the_command_sees_exactly_its_gpus_and_its_exit_status_comes_back(applied: Cli) -> None:
    result = applied(
        "run",
        "job=probe",
        "host=node1",
        "count=2",
        "--",
        sys.executable,
        "-c",
        SHOW_ENV + "; raise SystemExit(7)",
    )
    assert result.code == 7, result.err
    env = json.loads(result.out)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["ALLOCATOR_JOB"] == "probe"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["ALLOCATOR_HOST"] == "node1"
    assert applied("get", "job=probe").code == 6  # released when it ended
    ended = _last_release(applied, "probe")
    assert ended["ended"]["exit_status"] == 7  # type: ignore[index]

    # The same environment the agent would give a worker: `allocator env`'s, every variable.
    same = (
        "import json, os, subprocess, sys; want = json.loads(subprocess.check_output("
        "[sys.executable, '-m', 'allocator', 'env', 'job=probe', '-o', 'json']))[0]; "
        "sys.exit(0 if want and all(os.environ.get(k) == v for k, v in want.items()) else 9)"
    )
    result = applied("run", "job=probe", "host=node1", "gpus=2", "--", sys.executable, "-c", same)
    assert result.code == 0, result.err


def test_a_command_killed_by_a_signal_exits_128_plus_n(applied: Cli) -> None:
    result = applied(
        "run",
        "host=node1",
        "count=1",
        "--",
        sys.executable,
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    )
    assert result.code == 128 + signal.SIGKILL, result.err
    assert "run-" in result.err  # the made-up job name, shown on stderr


def test_per_gpu_starts_one_process_per_gpu_with_torchrun_variables(
    applied: Cli, tmp_path: Path
) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    script = (
        f"import os; open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write("
        "' '.join(os.environ[k] for k in ('CUDA_VISIBLE_DEVICES', 'LOCAL_RANK', 'WORLD_SIZE', "
        "'MASTER_ADDR', 'MASTER_PORT')))"
    )
    result = applied(
        "run",
        "job=ranks",
        "host=node1",
        "gpus=0,2",
        "--per-gpu",
        "--",
        sys.executable,
        "-c",
        script,
    )
    assert result.code == 0, result.err
    seen = {p.name: p.read_text().split() for p in out.iterdir()}
    assert [seen["0"][:3], seen["1"][:3]] == [["0", "0", "2"], ["2", "1", "2"]]
    assert seen["0"][3:] == seen["1"][3:] and seen["0"][4].isdigit()


def test_ctrl_c_reaches_the_command_and_frees_the_gpus_at_once(
    applied: Cli, cli_env: dict[str, str], popen: list[subprocess.Popen[bytes]]
) -> None:
    proc = _start(cli_env, popen, "job=held", *TAKE_ALL, "--", "sleep", "60")
    wait_for("run to hold the GPUs", lambda: _holds(applied, "held"))
    refused = applied("set", "job=train", "host=node1", "gpus=0,1,2")
    assert refused.code == 3 and "held by job 'held'" in refused.err, refused.err
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 128 + signal.SIGINT
    assert applied("get", "job=held").code == 6
    assert _last_release(applied, "held")["ended"]["exit_status"] == 130  # type: ignore[index]
    assert applied("set", "job=train", *TAKE_ALL).code == 0


def test_sigkill_of_run_frees_the_gpus_within_the_ttl_and_kills_the_command(
    applied: Cli, cli_env: dict[str, str], popen: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    proc = _start(
        cli_env, popen, "job=doomed", "ttl=2s", *TAKE_ALL, "--", sys.executable, "-c", script
    )
    # The file exists before the pid is written in it: wait for the pid.
    wait_for("run to hold the GPUs", lambda: _holds(applied, "doomed") and _text(pid_file))
    child = int(pid_file.read_text())
    proc.kill()
    killed = time.monotonic()
    proc.wait(10)
    asked_at: list[float] = []

    def gone() -> bool:  # when the read that saw it gone began: a slow CLI start is not counted
        asked_at.append(time.monotonic())
        return applied("get", "job=doomed").code == 6

    wait_for("the lease to expire", gone, timeout=10)
    assert asked_at[-1] - killed < 2 + 3  # the TTL, and the store's reaping of it
    assert applied("set", "job=train", *TAKE_ALL).code == 0
    # A zombie is dead: a test process that became a subreaper (the agent's
    # supervisor, in-process in unit tests) may be the orphan's parent and never reap it.
    wait_for("the command to die with run", lambda: not pid_alive(child))


def test_wait_starts_the_moment_the_gpus_are_released_and_times_out_naming_them(
    applied: Cli, cli_env: dict[str, str], popen: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    assert applied("set", "job=train", *TAKE_ALL).code == 0
    timed_out = applied("run", *TAKE_ALL, "--wait=1s", "--", "true")
    assert timed_out.code == 3
    assert "waited" in timed_out.err and "count=3" in timed_out.err and "train" in timed_out.err

    started = tmp_path / "started"
    proc = _start(
        cli_env,
        popen,
        "job=next",
        *TAKE_ALL,
        "--wait",
        "--",
        sys.executable,
        "-c",
        f"open({str(started)!r}, 'w').write('x')",
    )
    wait_for("next in the queue", lambda: _queued(applied) == ["next"], 60)
    assert not started.exists()
    assert applied("release", "job=train").code == 0
    released = time.monotonic()
    assert proc.wait(15) == 0
    assert started.exists() and time.monotonic() - released < 5


def test_usage_adds_up_what_history_recorded(applied: Cli) -> None:
    result = applied("run", "job=measured", "host=node1", "count=2", "--", "sleep", "2")
    assert result.code == 0, result.err
    recorded = _last_release(applied, "measured")["ended"]["gpu_seconds"]  # type: ignore[index]
    assert 2 * 2 <= recorded < 2 * 4
    usage = applied("usage", "--by", "job", "-o", "json")
    assert usage.code == 0, usage.err
    (row,) = [r for r in json.loads(usage.out)["rows"] if r["key"] == "measured"]
    # History's times are whole seconds: each end may be off by one per GPU.
    assert abs(row["gpu_hours"] * 3600 - recorded) <= 2 * 2
    by_user = json.loads(applied("usage", "-o", "json").out)["rows"]
    assert [r["key"] for r in by_user] == [pwd.getpwuid(os.getuid()).pw_name]


def test_bad_input_is_one_line_and_exit_2_with_nothing_held(applied: Cli) -> None:
    for words in (
        ["count=1"],
        ["count=1", "ttl=0s", "--", "true"],
        ["bogus=1", "--", "true"],
        ["count=1", "host=a,b", "--", "true"],
        ["count=1", "--wait=soon", "--", "true"],
    ):
        result = applied("run", *words)
        assert result.code == 2, (words, result.err)
        assert len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err
    assert applied("status", "-o", "json").out.count('"job": "run-') == 0
    missing = applied("run", "host=node1", "count=1", "--", "/nonexistent/cmd")
    assert missing.code == 2 and "cannot run" in missing.err
    assert applied("status", "-o", "json").out.count('"job": "run-') == 0


LEASE_SCRIPT = """
import json, os, signal, sys
import allocator
assert "allocator.leasing" not in sys.modules  # `import allocator` stays cheap
before = os.environ.get("CUDA_VISIBLE_DEVICES")
with allocator.lease(count=2, host="node1", job="notebook", ttl=2) as grant:
    print(json.dumps({"gpus": grant.gpus, "seen": os.environ["CUDA_VISIBLE_DEVICES"],
                      "device": str(grant.device())}), flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps({"after": os.environ.get("CUDA_VISIBLE_DEVICES") == before}))
"""


def test_lease_sets_this_processes_environment_and_releases_on_exit(
    applied: Cli, cli_env: dict[str, str]
) -> None:
    done = subprocess.run([sys.executable, "-c", LEASE_SCRIPT, "exit"], env=cli_env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    inside, after = (json.loads(line) for line in done.stdout.splitlines())
    assert inside == {"gpus": [0, 1], "seen": "0,1", "device": "cuda:0"}
    assert after == {"after": True}
    assert applied("get", "job=notebook").code == 6


def test_an_interpreter_that_dies_inside_a_lease_frees_its_gpus_within_the_ttl(
    applied: Cli, cli_env: dict[str, str]
) -> None:
    died = subprocess.run([sys.executable, "-c", LEASE_SCRIPT, "die"], env=cli_env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert died.returncode == -signal.SIGKILL and '"seen": "0,1"' in died.stdout
    killed = time.monotonic()
    assert applied("get", "job=notebook").code == 0  # held until the lease runs out
    wait_for("the lease to expire", lambda: applied("get", "job=notebook").code == 6, timeout=10)
    assert time.monotonic() - killed < 2 + 3


def test_an_operators_release_takes_the_gpus_back_and_stops_the_command(
    applied: Cli, cli_env: dict[str, str], popen: list[subprocess.Popen[bytes]]
) -> None:
    proc = _start(cli_env, popen, "job=taken", "ttl=1s", *TAKE_ALL, "--", "sleep", "60")
    wait_for("run to hold the GPUs", lambda: _holds(applied, "taken"))
    assert applied("release", "job=taken", "reason=needed elsewhere").code == 0
    assert proc.wait(15) == 128 + signal.SIGTERM
    assert proc.stderr is not None and b"released or changed by someone else" in proc.stderr.read()


def test_a_second_run_waiting_for_the_same_gpus_starts_the_moment_the_first_exits(
    applied: Cli, cli_env: dict[str, str], popen: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    go, second = tmp_path / "go", tmp_path / "second"
    until_go = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)"
    first = _start(cli_env, popen, "job=first", *TAKE_ALL, "--", sys.executable, "-c", until_go)
    wait_for("the first run to hold the GPUs", lambda: _holds(applied, "first"))
    waiter = _start(cli_env, popen, "job=second", *TAKE_ALL, "--wait=60s", "--", sys.executable,
                    "-c", f"open({str(second)!r}, 'w').write('x')")  # fmt: skip
    wait_for("second in the queue", lambda: _queued(applied) == ["second"], 60)
    assert waiter.poll() is None and not _holds(applied, "second") and not second.exists()
    go.write_text("")
    assert first.wait(15) == 0
    ended = time.monotonic()
    assert waiter.wait(15) == 0
    assert second.exists() and time.monotonic() - ended < 5


def _text(path: Path) -> str:
    """What ``path`` holds, or ``""`` while it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
