"""Which cgroup a process is in, as the agent reads it from ``/proc``."""

from __future__ import annotations

import os
from pathlib import Path

from allocator.agent.kernel.cgroups import process_cgroup


def test_a_process_is_in_the_cgroup_its_proc_entry_names(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n")
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("4:memory:/x\n0::/a/allocator/runs/run-1-abc\n")
    found = process_cgroup(7, mountinfo, proc)
    assert found == Path("/sys/fs/cgroup/a/allocator/runs/run-1-abc")
    assert process_cgroup(8, mountinfo, proc) is None  # gone


def test_this_process_is_a_member_of_its_own_cgroup() -> None:
    own = process_cgroup(os.getpid())
    if own is not None:
        assert str(os.getpid()) in (own / "cgroup.procs").read_text().split()
