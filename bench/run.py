"""``make bench``: every row of the speed-and-scale table, printed and written to results.json.

Each row compares ours with a baseline measured in the same run (a ratio),
or holds a count judged on its own; ``results.json`` is a list of
``{name, ours, baseline, ratio, target, pass, unit}`` objects (plus the
spread, 10th to 90th percentile, of ours and of the baseline, the number
of samples and a note). A missed target is ``"pass": false``; the run still
completes and exits 0, so the table always gets written.

Usage: ``python -m bench.run [--smoke] [--quick] [--only GROUP,...] [--out FILE]``
(groups: cli, agent, cluster, fleet, scale, usage, page).
``--smoke`` runs every row at a tiny size in seconds (what the test suite
checks); ``--quick`` shortens the idle windows and rounds;
``--markdown FILE`` prints the table of an earlier results file in Markdown
(for docs/performance.md) and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Row, stop_command_servers

__all__ = ["SIZES", "format_markdown", "format_table", "main"]

HERE = Path(__file__).resolve().parent
GROUPS = ("cli", "agent", "cluster", "fleet", "scale", "usage", "page")

#: Sizes per mode: CLI rounds, simulated hosts/agents, moves, idle seconds, applies.
SIZES = {
    "full": {"rounds": 20, "hosts": 1000, "moves": 50, "idle": 60.0, "applies": 5, "place": 5.0},
    "quick": {"rounds": 10, "hosts": 1000, "moves": 20, "idle": 15.0, "applies": 3, "place": 3.0},
    "smoke": {"rounds": 1, "hosts": 10, "moves": 1, "idle": 0.3, "applies": 1, "place": 0.2},
}
#: Processes the fan-out rows spread the agents' watches over, per mode.
WATCHER_PROCESSES = {"full": 8, "quick": 8, "smoke": 2}
#: The large fleet of the scale rows, per mode (the small one is ``hosts``):
#: 25,000 hosts x 8 GPUs, the largest training clusters.
LARGE = {"full": 25_000, "quick": 25_000, "smoke": 30}


def format_table(rows: Sequence[Row]) -> str:
    """The rows as a fixed-width table."""
    lines = [
        f"{'row':<44} {'ours':>10} {'baseline':>10} {'ratio':>7}  {'target':<16} result",
    ]
    for row in rows:
        baseline = "-" if row.baseline is None else f"{row.baseline:.1f}"
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        verdict = "pass" if row.passed else "MISS"
        lines.append(
            f"{row.name:<44} {row.ours:>10.2f} {baseline:>10} {ratio:>7}  "
            f"{row.target:<16} {verdict}  ({row.unit})"
        )
    return "\n".join(lines)


def format_markdown(results: Sequence[dict[str, object]]) -> str:
    """Rows of a results file as a Markdown table."""

    def number(value: object) -> str:
        return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| row | ours | baseline | ratio | target | result |", "|---|---|---|---|---|---|"]
    for row in results:
        unit = row["unit"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        verdict = "pass" if row["pass"] else "**missed**"
        lines.append(
            f"| {row['name']} | {number(row['ours'])} {unit} | "
            f"{number(row['baseline'])}{'' if row['baseline'] is None else ' ' + str(unit)} | "
            f"{ratio} | {row['target']} | {verdict} |"
        )
    return "\n".join(lines)


def _run_group(group: str, args: argparse.Namespace, work: Path) -> list[Row]:
    started = time.monotonic()
    print(f"== {group}", flush=True)
    if group == "cli":
        from bench import bench_cli

        rows = bench_cli.rows(args.rounds, args.hosts, work, warmup=0 if args.smoke else 1)
    elif group == "agent":
        from bench import bench_agent

        rows = bench_agent.rows(args, work)
    elif group == "cluster":
        from bench import bench_cluster

        rows = bench_cluster.rows(args, work)
    elif group == "scale":
        from bench import bench_scale

        rows = bench_scale.rows(args, work)
        from bench import bench_history

        rows += bench_history.scale_rows(args, work)
    elif group == "usage":
        from bench import bench_usage

        rows = bench_usage.rows(args, work)
    elif group == "page":
        from bench import bench_page

        rows = bench_page.rows(args, work)
    else:
        from bench import bench_fleet

        args.agents = args.hosts
        args.place_seconds = args.place
        rows = bench_fleet.rows(args, work)
        from bench import bench_fanout, bench_history

        rows += bench_fanout.rows(args, work)

        rows += bench_history.rows(args, work)
    for row in rows:
        print(f"   {row.name}: {row.ours:.2f} {row.unit} ({'pass' if row.passed else 'MISS'})")
    print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected groups, print the table, write the results file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="every row at a tiny size")
    mode.add_argument("--quick", action="store_true", help="shorter windows and fewer rounds")
    parser.add_argument(
        "--only", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS)
    )
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    parser.add_argument("--markdown", type=Path, help="print FILE's table in Markdown and stop")
    args = parser.parse_args(argv)
    if args.markdown is not None:
        print(format_markdown(json.loads(args.markdown.read_text())))
        return 0
    sizes = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    for name, value in sizes.items():
        setattr(args, name, value)
    args.large = LARGE["smoke" if args.smoke else "quick" if args.quick else "full"]
    args.watcher_processes = WATCHER_PROCESSES[
        "smoke" if args.smoke else "quick" if args.quick else "full"
    ]
    groups = [g for g in args.only.split(",") if g]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    started = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="allocator-bench-") as tmp:
        # The console script's command servers live here for this run only: every row
        # starts from none, and none outlives the run.
        runtime = Path(tmp) / "run"
        runtime.mkdir(mode=0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        try:
            for group in groups:
                (Path(tmp) / group).mkdir()
                rows += _run_group(group, args, Path(tmp) / group)
        finally:
            stop_command_servers(runtime)
    args.out.write_text(json.dumps([row.to_json() for row in rows], indent=2) + "\n")
    print()
    print(format_table(rows))
    missed = sum(not row.passed for row in rows)
    print(
        f"\n{len(rows)} rows, {missed} missed, {time.monotonic() - started:.0f} s; "
        f"written to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
