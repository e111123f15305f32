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
    from allocator.placement.time_limit import time_left_text
    from allocator.status.snapshots import job_not_found
    from allocator.util.times import utc_now

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
        failed = _gave_up(allocator, found)
    finally:
        allocator.store.close()
    if not found:
        raise job_not_found(job, host, others)
    if host is None and found[0].nodes:
        _emit_group(args, found, failed)
        return 0
    lines = []
    for a in found:
        where = "cpu" if a.mode == "cpu" else "gpus " + ",".join(map(str, a.gpus))
        extra = f" reason={a.reason!r}" if a.reason else ""
        if a.ends_at:
            extra += f" ends {a.ends_at} ({time_left_text(a.ends_at, utc_now())} left)"
        lines.append(f"{a.job}@{a.host}: {where} (since {a.updated_at} by {a.updated_by}){extra}")
        lines += _gave_up_lines(failed.get(a.host))
    data = [_with_gave_up(json.loads(a.to_json()), failed.get(a.host)) for a in found]
    emit(data if len(data) > 1 else data[0], output_format(args), "\n".join(lines))
    return 0


def _gave_up(allocator: Any, found: list[Any]) -> dict[str, Any]:
    """Per host, the worker record of a share that finished, or that the agent gave up on
    with its last output."""
    from allocator.errors import BadRecord
    from allocator.records.types import WorkerRecord

    failed: dict[str, Any] = {}
    for a in found:
        item = allocator.store.get(allocator.layout.workers(a.host, a.job))
        try:
            record = WorkerRecord.from_json(item.value) if item is not None else None
        except BadRecord:  # a damaged record says nothing about why
            continue
        if record is not None and (record.output_tail or record.state == "finished"):
            failed[a.host] = record
    return failed


def _gave_up_lines(record: Any) -> list[str]:
    """The failed worker's last lines, under the assignment's line (text output)."""
    from allocator.util.printable import printable

    if record is None:
        return []
    if record.state == "finished":  # ended by itself: finished (exit 0)
        return [f"  {printable(record.message or 'finished')} on {record.host}"]
    head = f"  {record.state} on {record.host}, log {printable(record.log_path or 'unknown')}:"
    return [head, *(f"    | {printable(line)}" for line in record.output_tail)]


def _with_gave_up(data: dict[str, Any], record: Any) -> dict[str, Any]:
    """The assignment's document, with ``gave_up`` when its agent gave up on the job."""
    if record is not None and record.output_tail:
        data["gave_up"] = {"output_tail": list(record.output_tail), "log_path": record.log_path}
    return data


def _emit_group(args: argparse.Namespace, shares: list[Any], failed: dict[str, Any]) -> None:
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
    text = "\n".join([text, *(line for s in mine for line in _gave_up_lines(failed.get(s.host)))])
    data = {
        "job": first.job,
        "nodes": list(nodes),
        "master_port": first.master_port,
        "missing": missing,
        "assignments": [_with_gave_up(json.loads(s.to_json()), failed.get(s.host)) for s in shares],
    }
    emit(data, output_format(args), text)
