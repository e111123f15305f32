"""``run``'s view of its command's tree: /proc's children lists, as psutil sees it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import psutil
import pytest

from allocator.cli.foreground import _proc_descendants
from tests.support.waiting import wait_for


def test_the_tree_read_from_proc_is_the_tree_psutil_finds() -> None:
    # A shell with a background child, a setsid grandchild and a foreground sleep.
    shell = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 30 & setsid sh -c 'sleep 30' & sleep 30"],
        start_new_session=True,
    )
    try:
        wait_for("the tree to start", lambda: len(psutil.Process(shell.pid).children(True)) >= 4)
        found = _proc_descendants(shell.pid)
        assert found is not None, "this kernel keeps /proc/PID/task/TID/children"
        expected = {p.pid for p in psutil.Process(shell.pid).children(recursive=True)}
        assert {pid for pid, _ in found} == expected
        assert not any(zombie for _, zombie in found)
    finally:
        for process in psutil.Process(shell.pid).children(recursive=True):
            process.kill()
        shell.kill()
        shell.wait()


def test_a_zombie_below_is_seen_as_one() -> None:
    # The shell's child exits; the shell (stopped) cannot reap it: a zombie below the shell.
    shell = subprocess.Popen(["/bin/sh", "-c", "true & kill -STOP $$; wait"])
    try:
        wait_for(
            "a zombie below the shell",
            lambda: any(zombie for _, zombie in _proc_descendants(shell.pid) or []),
        )
        assert [z for _, z in _proc_descendants(shell.pid) or []] == [True]
    finally:
        shell.kill()
        shell.wait()


# `Children` signals every process below the process it runs in, as `run` must (a
# subreaper's orphans are its own): it runs in a process of its own here, never in
# the test's, whose other children (the session's etcd) are none of its business.
_CHILDREN = """
import json, signal, sys
from allocator.cli.foreground import Children
argv, limit, grace = json.loads(sys.argv[1])
children = Children(argv, [{}], grace=grace, time_limit=limit)
children.start()
try:
    status = children.wait()
finally:
    children.signal(signal.SIGKILL)
    children.close()
print(json.dumps({"status": status, "timed_out": children.timed_out}))
"""


def _run_children(argv: list[str], limit: float, grace: float = 10.0) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILDREN, json.dumps([argv, limit, grace])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_command_that_ignores_sigterm_ends_at_its_time_limit() -> None:
    argv = ["sh", "-c", 'trap "" TERM; sleep 60 & wait; sleep 60']
    found = _run_children(argv, limit=0.5, grace=0.5)
    assert found["timed_out"] is True
    assert found["status"] != 0


def test_a_command_within_its_time_limit_is_not_stopped() -> None:
    found = _run_children(["true"], limit=60.0)
    assert found == {"status": 0, "timed_out": False}


def test_fg_while_the_keeper_starts_leaves_run_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGCONT handled inside Ctrl-Z's handler (the keeper takes a while to start).

    Stopping after it would stop ``run`` for ever: no second SIGCONT comes.
    """
    import os
    import signal

    from allocator.cli.foreground import Children

    stops: list[int] = []
    ended: list[bool] = []
    children: Children

    def keeper_starting() -> Callable[[], None]:
        if not ended:
            children.resume()  # `fg` arrives now, the first time
        return lambda: ended.append(True)

    children = Children(["true"], [{}], while_stopped=keeper_starting)
    monkeypatch.setattr(children, "signal", lambda signum: None)
    monkeypatch.setattr(os, "kill", lambda pid, signum: stops.append(signum))
    children.suspend()
    assert signal.SIGSTOP not in stops
    assert ended == [True]  # the keeper it started is ended: run keeps its own lease again
    children.suspend()  # a later Ctrl-Z stops as before
    assert stops == [signal.SIGSTOP]
