"""What a worker compares with its client before it starts the client's processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from allocator.resident import context


@contextmanager
def _child(before: Callable[[], None] | None = None) -> Iterator[int]:
    """A process of this one's, changed by ``before``; its pid while it waits."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        preexec_fn=before,
    )
    try:
        yield child.pid
    finally:
        child.communicate(b"")


def test_a_process_passes_on_its_cgroup_namespaces_cpus_and_priority() -> None:
    found = context.facts("self")
    assert found["cgroup"] == Path("/proc/self/cgroup").read_text().strip()
    assert found["ns/mnt"].startswith("mnt:[")
    assert found["nice"] == str(os.getpriority(os.PRIO_PROCESS, 0))
    assert found["Cpus_allowed_list"]
    assert found["root"] == "/"


def test_a_child_started_as_this_one_does_not_differ() -> None:
    with _child() as pid:
        assert context.difference(pid) is None


def _nicer() -> None:
    os.nice(2)


def _likelier_oom_victim() -> None:
    Path("/proc/self/oom_score_adj").write_text("50")  # raising it needs no privilege


@pytest.mark.parametrize(
    ("before", "named"),
    [(_nicer, "nice"), (_likelier_oom_victim, "oom_score_adj")],
    ids=["nice", "oom_score_adj"],
)
def test_a_child_that_differs_is_named_by_what_differs(
    before: Callable[[], None], named: str
) -> None:
    with _child(before) as pid:
        assert context.difference(pid) == named


def test_a_process_that_is_gone_differs_in_everything() -> None:
    with _child() as pid:
        pass
    found = context.difference(pid)
    assert found is not None and found.startswith(f"cannot read process {pid}")
