"""Workers run on the CPUs (and NUMA memory) their spec names: real workers, real affinity.

This machine's CPUs are at least {0, 1}; the sets used stay within them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from allocator.agent.planning.types import Start
from tests.support import supervision
from tests.support.supervision import AGENT_ENV, Harness, job_spec

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and two CPUs",
)
make_harness = supervision.make_harness
h = supervision.h


def pinned(spec_cpus: tuple[int, ...], h: Harness, *args: str) -> dict[str, Any]:
    spec = job_spec(h.tmp, args=args)
    workers = tuple(replace(w, cpus=spec_cpus) for w in spec.workers)
    h.sup.apply(Start("train", replace(spec, workers=workers), "new"))
    return h.wait_report("train")


def test_a_worker_and_what_it_starts_run_on_the_cpus_of_its_spec(h: Harness) -> None:
    report = pinned((1,), h, "--spawn-child")
    assert os.sched_getaffinity(int(report["pid"])) == {1}
    assert os.sched_getaffinity(int(report["child_pid"])) == {1}
    started = [fields for name, fields in h.events if name == "worker-started"]
    assert started[-1]["cpus"] == "1"


def test_a_worker_without_cpus_keeps_the_agents_affinity(h: Harness) -> None:
    report = pinned((), h)
    assert os.sched_getaffinity(int(report["pid"])) == os.sched_getaffinity(0)


def test_cpus_the_kernel_refuses_leave_the_worker_running_unpinned_and_say_so(h: Harness) -> None:
    absent = max(os.sched_getaffinity(0)) + 4096
    report = pinned((absent,), h)
    assert os.sched_getaffinity(int(report["pid"])) == os.sched_getaffinity(0)
    log = (h.tmp / "logs" / "train.log").read_text()
    assert f"allocator-shim: cannot pin the worker to CPUs [{absent}]" in log


NUMACTL = """\
#!{python}
import json, os, sys
with open({record!r}, "w") as out:
    json.dump(sys.argv[1:], out)
args = sys.argv[1:]
command = args[args.index("--") + 1:]
os.execv(command[0], command)
"""


def test_memory_is_bound_to_the_gpus_numa_nodes_with_numactl_where_it_is_installed(
    make_harness: Callable[..., Harness], tmp_path: Path
) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "numactl.json"
    numactl = tools / "numactl"
    numactl.write_text(NUMACTL.format(python=sys.executable, record=str(record)))
    numactl.chmod(0o755)
    path = f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"
    h = make_harness(base_env={**AGENT_ENV, "PATH": path})
    spec = job_spec(h.tmp)
    workers = tuple(replace(w, cpus=(0,), mems=(0, 1)) for w in spec.workers)
    h.sup.apply(Start("train", replace(spec, workers=workers), "new"))
    report = h.wait_report("train")
    argv = json.loads(record.read_text())
    assert argv[:2] == ["--membind=0-1", "--"]
    assert argv[2:] == list(spec.workers[0].argv)
    assert report["argv"] == list(spec.workers[0].argv[1:])  # the worker itself, exec'd by it
    assert os.sched_getaffinity(int(report["pid"])) == {0}


def test_without_numactl_the_worker_runs_as_its_command_says(h: Harness) -> None:
    spec = job_spec(h.tmp)
    workers = tuple(replace(w, mems=(0,)) for w in spec.workers)
    h.sup.apply(Start("train", replace(spec, workers=workers), "new"))
    report = h.wait_report("train")
    assert report["argv"] == list(spec.workers[0].argv[1:])
