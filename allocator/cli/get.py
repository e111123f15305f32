"""``allocator get``: show a job's assignment."""

from __future__ import annotations

import argparse
import json
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``get`` command."""
    add_words_command(
        commands,
        "get",
        run,
        help="show a job's assignment",
        usage="allocator get job=NAME [host=H]",
        description="Show where a job holds GPUs. Without host= the job is found through its "
        "index; a job across several hosts is shown as one (its nodes in rank order, its "
        "MASTER_PORT, every share). Exits 6 if the job holds nothing.",
    )


def run(args: argparse.Namespace) -> int:
    """Print the job's assignments (one line per host, or JSON/YAML)."""
    from allocator.cli.args import parse_target_args
    from allocator.cli.output import emit
    from allocator.status.snapshots import job_not_found

    job, host = parse_target_args(args.words)
    allocator = open_allocator(args)
    try:
        if host is not None:
            state = allocator.host(host)
            held = state.assignments.get(job)
            found = [held] if held is not None else []
            others = list(state.assignments)
        else:
            found, others = allocator.find_job(job), []
    finally:
        allocator.store.close()
    if not found:
        raise job_not_found(job, host, others)
    if host is None and found[0].nodes:
        _emit_group(args, found)
        return 0
    lines = []
    for a in found:
        where = "cpu" if a.mode == "cpu" else "gpus " + ",".join(map(str, a.gpus))
        extra = f" reason={a.reason!r}" if a.reason else ""
        lines.append(f"{a.job}@{a.host}: {where} (since {a.updated_at} by {a.updated_by}){extra}")
    data = [json.loads(a.to_json()) for a in found]
    emit(data if len(data) > 1 else data[0], output_format(args), "\n".join(lines))
    return 0


def _emit_group(args: argparse.Namespace, shares: list[Any]) -> None:
    """A job across hosts as one: nodes, MASTER_PORT, GPUs, and any share missing."""
    from allocator.cli.output import emit
    from allocator.control.across_hosts import describe_shares

    first = shares[0]
    nodes = first.nodes
    mine = [s for s in shares if s.nodes == nodes]
    missing = [h for h in nodes if h not in {s.host for s in mine}]
    extra = f" reason={first.reason!r}" if first.reason else ""
    lack = f"; NO SHARE on {', '.join(missing)}" if missing else ""
    text = (
        f"{first.job}@{','.join(nodes)}: {describe_shares(mine)} ({len(nodes)} nodes, "
        f"MASTER_PORT {first.master_port}; since {first.updated_at} by {first.updated_by})"
        f"{extra}{lack}"
    )
    data = {
        "job": first.job,
        "nodes": list(nodes),
        "master_port": first.master_port,
        "missing": missing,
        "assignments": [json.loads(s.to_json()) for s in shares],
    }
    emit(data, output_format(args), text)
