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
        description="Show where a job holds GPUs. Without host= every host is searched "
        "(one read). Exits 6 if the job holds nothing.",
    )


def run(args: argparse.Namespace) -> int:
    """Print the job's assignments (one line per host, or JSON/YAML)."""
    from allocator.assignments import job_not_found
    from allocator.cli.args import parse_target_args
    from allocator.cli.output import emit

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
    lines = []
    for a in found:
        where = "cpu" if a.mode == "cpu" else "gpus " + ",".join(map(str, a.gpus))
        extra = f" reason={a.reason!r}" if a.reason else ""
        lines.append(f"{a.job}@{a.host}: {where} (since {a.updated_at} by {a.updated_by}){extra}")
    data = [json.loads(a.to_json()) for a in found]
    emit(data if len(data) > 1 else data[0], output_format(args), "\n".join(lines))
    return 0
