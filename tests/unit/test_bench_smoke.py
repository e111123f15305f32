"""``make bench`` stays runnable: every row at a tiny size writes a well-formed results file.

Timings are the benchmark's business, not the test suite's: this checks
the shape of what ``bench/run.py --smoke`` writes, never its numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"name", "ours", "baseline", "ratio", "target", "pass", "unit"}
#: The table's rows, by the group (``--only``) that writes them.
ROWS = {
    "cli": (
        "CLI set, etcd",
        "CLI get, etcd, no host=",
        "CLI set in its own process (ALLOCATOR_SERVER=0), etcd",
        "CLI get in its own process (ALLOCATOR_SERVER=0), etcd",
        "CLI set, SQLite",
        "run -- python -c pass, SQLite",
        "fleet status",
        "policy validate",
    ),
    "agent": (
        "propagation, SQLite, median",
        "propagation, SQLite, worst",
        "propagation, etcd, median",
        "propagation, etcd, worst",
        "queue hand-off, SQLite, median",
        "queue hand-off, etcd, median",
        "cancel -> GPUs free, SQLite, median",
        "cancel -> GPUs free, etcd, median",
        "submit -> running, SQLite, median",
        "submit -> running, etcd, median",
        "preemption hand-off, SQLite, median",
        "preemption hand-off, etcd, median",
        "agent footprint",
        "agent idle CPU, SQLite",
        "agent idle CPU, etcd",
        "agent CPU with etcd down",
    ),
    "cluster": (
        "CLI set through a follower, 3-member cluster vs one member",
        "propagation, 3-member cluster, leader killed mid-run vs one member, median",
        "propagation, 3-member cluster, leader killed mid-run vs one member, worst",
    ),
    "fleet": (
        "placement throughput",
        "etcd write rate, 10 idle agents",
        "etcd CPU, 10 idle agents",
        "etcd write rate, 30 idle agents",
        "etcd CPU, 30 idle agents",
        "fan-out: last of 10 watchers (2 processes) sees a policy change",
        "policy bytes per agent per apply (all-host change)",
        "policy bytes per agent per one-host change elsewhere",
        "etcd CPU per apply per agent",
        "history --limit 20, etcd",
        "history --limit 20, keys read",
    ),
    "scale": (
        "CLI set, 30 vs 10 hosts",
        "CLI get, 30 vs 10 hosts",
        "CLI status host=, 30 vs 10 hosts",
        "policy apply of a one-host change, 30 vs 10 hosts",
        "first policy apply, 30 hosts",
        "status -o json, 30 hosts vs etcdctl get --prefix -w json",
        "status --summary vs whole status, 30 hosts",
    ),
    "usage": (
        "usage --by team --since 7d, time",
        "usage --by team --since 7d, peak RSS",
        "serve RSS, 50 hosts, page open with its usage panel",
    ),
    "page": ("page: first whole heatmap, 30 hosts", "page: height, 30 hosts"),
}


def test_the_row_list_names_every_group_of_the_bench() -> None:
    from bench.run import GROUPS

    assert set(ROWS) == set(GROUPS)


# One run per group, so that the groups run side by side under xdist: every
# row of the table is written exactly once, by its own group and by no other.
@pytest.mark.slow
@pytest.mark.parametrize("group", list(ROWS))
def test_a_smoke_run_writes_every_row_of_the_table(tmp_path: Path, group: str) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--only", group, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())
    names = [row["name"] for row in rows]
    for owner, expected_rows in ROWS.items():
        for expected in expected_rows:
            written = sum(name.startswith(expected) for name in names)
            assert written == (1 if owner == group else 0), (expected, names)
    for row in rows:
        assert set(row) >= FIELDS, row
        assert isinstance(row["pass"], bool) and row["ours"] >= 0 and row["target"]
        if row["baseline"] is not None:
            assert row["baseline"] > 0
            assert abs(row["ratio"] - row["ours"] / row["baseline"]) < 0.01 * row["ratio"] + 1e-3
            assert set(row["spread"]) == {"ours", "baseline"}
    if group == "fleet":
        # The fan-out watchers saw the apply's events (a harness that measured nothing reads 0).
        delivered = next(
            r for r in rows if r["name"].startswith("policy bytes per agent per apply")
        )
        assert delivered["ours"] > 0
    assert "row" in done.stdout and "written to" in done.stdout  # the table was printed


def test_the_results_table_says_which_rows_missed() -> None:
    from bench.common import Row
    from bench.run import format_table

    table = format_table(
        [
            Row("fast", 1.0, 2.0, 0.5, "<= 2x", True, "ms"),
            Row("slow", 9.0, 1.0, 9.0, "<= 2x", False, "ms"),
            Row("count", 3.0, None, None, "<= 5 MiB", True, "MiB"),
        ]
    ).splitlines()
    assert "pass" in table[1] and "MISS" in table[2] and "9.00x" in table[2]
    assert table[3].split()[2] == "-"  # no baseline
