"""Reading the variables a host's processes carry from ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys

from allocator.util.process_environ import variables_of_processes
from tests.support.waiting import wait_for


def test_a_process_carrying_the_variables_is_found_with_their_values() -> None:
    env = {"PATH": "/usr/bin:/bin", "PE_TEST_MARK": "m-1", "PE_TEST_GPUS": "3,1"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:

        def seen() -> dict[str, bytes] | None:
            found = dict(variables_of_processes(("PE_TEST_MARK", "PE_TEST_GPUS")))
            return found.get(child.pid)

        assert wait_for("the child's variables", seen) == {
            "PE_TEST_MARK": b"m-1",
            "PE_TEST_GPUS": b"3,1",
        }
    finally:
        child.kill()
        child.wait()


def test_this_process_and_processes_without_the_variables_are_skipped() -> None:
    assert "PATH" in os.environ  # set when this process started, so in its /proc environ
    assert all(pid != os.getpid() for pid, _ in variables_of_processes(("PATH",)))
    assert list(variables_of_processes(("PE_TEST_NOBODY_SETS_THIS",))) == []
