"""``run``'s view of its command's tree: /proc's children lists, as psutil sees it."""

from __future__ import annotations

import signal
import subprocess

import psutil

from allocator.cli.foreground import Children, _proc_descendants
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


def test_a_command_that_ignores_sigterm_ends_at_its_time_limit() -> None:
    children = Children(
        ["sh", "-c", 'trap "" TERM; sleep 60 & wait; sleep 60'], [{}], grace=0.5, time_limit=0.5
    )
    children.start()
    try:
        status = children.wait()
    finally:
        children.signal(signal.SIGKILL)
        children.close()
    assert children.timed_out
    assert status != 0


def test_a_command_within_its_time_limit_is_not_stopped() -> None:
    children = Children(["true"], [{}], time_limit=60.0)
    children.start()
    assert children.wait() == 0
    assert not children.timed_out
