"""Each command's start-up, kept in a budget of modules (counts, not timings).

A command's start is mostly what it imports, and timings on a shared machine
are noise; module counts are not. Each command has a budget: the modules of
this package and all modules (the standard library's and dependencies'
included) loaded once it has run. A change that pulls more into a command
fails here, naming what it added, and either earns a raised budget (in the
same change, with the reason) or moves the import to where it is used.

The budgets were the counts measured when they were set, plus three or four
of this package's modules and six of all so a small refactoring does not trip them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "policy.example.yaml"

_PROBE = """
import json, sys
from allocator.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""

#: Bare ``python -c pass`` loads about 70 modules; every budget counts those too.
#: (command words, allocator modules at most, all modules at most)
SQLITE_BUDGETS: list[tuple[tuple[str, ...], int, int]] = [
    (("--help",), 40, 174),
    (("get", "job=train"), 41, 170),
    # A set reads the host's queue to say which waiting requests it passed, and
    # resolves the pool's time limit: the queue's order and view, and time_limit.
    (("set", "job=train", "gpus=1", "host=node1"), 73, 203),
    (("release", "job=train", "host=node1"), 58, 188),
    (("status",), 64, 195),
    (("queue",), 50, 179),
    (("history",), 42, 174),
    (("usage",), 52, 183),
    (("run", "--help"), 10, 86),
    # Take, run /bin/true, release: the queue's wait, the cgroup and the visibility
    # rules of every vendor; not the agent's planner (a job no policy declares).
    (("run", "count=1", "--", "true"), 117, 270),
    (("submit", "--help"), 10, 87),
]

ETCD_BUDGETS: list[tuple[tuple[str, ...], int, int]] = [
    # util.command_words: the command word, read by the console script's door too.
    (("get", "job=train"), 43, 181),
    (("set", "job=train", "gpus=1", "host=node1"), 76, 216),
    (("release", "job=train", "host=node1"), 60, 201),
    (("status",), 66, 208),
]


def _modules_after(args: tuple[str, ...], store: str) -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "ALLOCATOR_STORE": store,
            "ALLOCATOR_HOST": "node1",
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        },
        check=False,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return int(report["code"]), set(report["modules"])


def _within(args: tuple[str, ...], modules: set[str], own_most: int, all_most: int) -> None:
    own = sorted(m for m in modules if m.split(".")[0] == "allocator")
    assert len(own) <= own_most, (
        f"`allocator {' '.join(args)}` loads {len(own)} allocator modules (budget {own_most}): "
        f"{own}"
    )
    assert len(modules) <= all_most, (
        f"`allocator {' '.join(args)}` loads {len(modules)} modules (budget {all_most}): "
        f"{sorted(m for m in modules if m.split('.')[0] != 'allocator')}"
    )


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    """A store of each test's own, ``train`` holding GPU 0 of node1: no command's count
    depends on which ran before it (a release of a job held nowhere loads more)."""
    from allocator.control.client import Allocator
    from allocator.placement.request import Request
    from allocator.store import open_store

    url = f"sqlite://{tmp_path / 's.db'}"
    store = open_store(url, create=True)
    try:
        allocator = Allocator(store)
        allocator.apply_policy(_EXAMPLE.read_text(), "policy.yaml")
        allocator.assign(Request(job="train", host="node1", gpus=(0,)))  # get/release find it
    finally:
        store.close()
    return url


@pytest.mark.parametrize(("args", "own_most", "all_most"), SQLITE_BUDGETS)
def test_each_command_on_sqlite_stays_in_its_module_budget(
    args: tuple[str, ...], own_most: int, all_most: int, sqlite_store: str
) -> None:
    code, modules = _modules_after(args, sqlite_store)
    assert code in (0, 6), code  # 6: the job holds nothing (get, release before a set)
    _within(args, modules, own_most, all_most)


def test_a_budget_counts_what_the_command_really_loads(sqlite_store: str) -> None:
    # The probe sees the command's imports: a write loads the planner, a help page does not.
    _, helped = _modules_after(("run", "--help"), sqlite_store)
    _, written = _modules_after(("set", "job=probe", "gpus=1", "host=node1"), sqlite_store)
    assert "allocator.control.one_host" in written
    assert "allocator.control.one_host" not in helped
    assert len(written) > len(helped)


@pytest.mark.parametrize(("args", "own_most", "all_most"), ETCD_BUDGETS)
def test_each_command_on_etcd_stays_in_its_module_budget(
    args: tuple[str, ...], own_most: int, all_most: int, etcd_server: object, prefix: str
) -> None:
    from allocator.control.client import Allocator
    from allocator.placement.request import Request
    from allocator.store import open_store

    url = str(etcd_server.url)  # type: ignore[attr-defined]
    store = open_store(url)
    try:
        allocator = Allocator(store, prefix=prefix)
        allocator.apply_policy(_EXAMPLE.read_text(), "policy.yaml")
        allocator.assign(Request(job="train", host="node1", gpus=(0,)))  # get/release find it
    finally:
        store.close()
    code, modules = _modules_after(("--prefix", prefix, *args), url)
    assert code == 0, code
    _within(args, modules, own_most, all_most)
