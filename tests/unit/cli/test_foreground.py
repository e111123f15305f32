"""``run``'s view of its command's tree: /proc's children lists, as psutil sees it."""

from __future__ import annotations

import subprocess

import psutil

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
