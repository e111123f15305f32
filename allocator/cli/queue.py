"""``allocator queue``: the requests waiting for GPUs (like Slurm's ``squeue``).

Position (in its host's queue), host, holder, job, what it asked for, since
when, its priority, and why it waits: ``GPU 3 held by job 'train'``,
``over quota team-a 8/8 GPUs``, or the request ahead of it.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format

__all__ = ["register"]

USAGE = "allocator queue [host=H] [-o table|json|yaml]"


def register(commands: Any) -> None:
    """Add the ``queue`` command."""
    add_words_command(
        commands,
        "queue",
        run,
        help="show the requests waiting for GPUs (set --wait)",
        usage=USAGE,
        description=__doc__,
    )


def run(args: argparse.Namespace) -> int:
    """Read the queue (of one host, or all), print it."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit, render_table
    from allocator.control.queue_view import queue_lines
    from allocator.records.keys import validate_name
    from allocator.util.times import utc_now

    kv = parse_key_values(args.words, ("host",))
    host = validate_name(kv["host"], "host") if "host" in kv else None
    allocator = open_allocator(args)
    try:
        lines = queue_lines(allocator, utc_now(), host)
    finally:
        allocator.store.close()
    rows = [
        [str(q.position), q.host, q.holder, q.job, q.requested, q.since, str(q.priority), q.why]
        for q in lines
    ]
    headers = ("POS", "HOST", "WHO", "JOB", "WHAT", "SINCE", "PRIO", "WHY")
    text = render_table(headers, rows) if rows else "no requests are waiting"
    emit({"queue": [q.to_dict() for q in lines]}, output_format(args), text)
    return 0
