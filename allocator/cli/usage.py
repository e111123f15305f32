"""``allocator usage``: GPU-hours (and slot-hours) held, from history, like ``sreport``.

Every holding that history records (a ``set`` or ``move`` to its ``move`` or
``release``; one still open up to now) is counted for the time it overlaps
the window, grouped by who held it (``--by user``, the default), their team,
the job, the host's pool or the host. A holding whose command was killed
and whose lease expired has no end in history: it is counted as ending at
its start, and the report says how many there were. Whoever held it is
the assignment's holder where recorded, else the user who wrote it; with
``--by team`` each of that user's teams is credited in full. A holding
whose start history no longer keeps counts from its assignment's time.

Ended holdings are read from the usage rollup (rows each ending entry
writes, filed by the day it ended), only the days inside the window, and
clipped to it exactly. History written before the rollup existed is folded
into it once by ``--rebuild``; until then usage is counted from the whole
history, and the output says which (``source``).
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_common_options, note, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.control.client import Allocator

__all__ = ["register"]

USAGE = "allocator usage [--since 30d|RFC3339] [--by user|team|job|pool|host] [--rebuild] [-o json]"


def register(commands: Any) -> None:
    """Add the ``usage`` command."""
    from allocator.history.usage import BY

    parser = commands.add_parser(
        "usage", help="GPU-hours held per user, team, job, pool or host", usage=USAGE
    )
    parser.description = __doc__
    parser.add_argument("--since", metavar="WHEN", default="30d", help="window start (30d)")
    parser.add_argument("--by", choices=BY, default="user", help="group by (default: user)")
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="first fold the history written before the rollup into it (once, after upgrading)",
    )
    add_common_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Read every host's history and the current assignments; print the totals."""
    from allocator.cli.output import emit
    from allocator.history.stream import parse_since
    from allocator.status.usage_report import usage_report
    from allocator.util.times import utc_now

    now = utc_now()
    since = parse_since(args.since, now)
    allocator = open_allocator(args)
    try:
        if args.rebuild:
            _rebuild(allocator, now)
        document, rows = usage_report(allocator, since, args.by, now)
    finally:
        allocator.store.close()
    unended = document["unended"]
    if document["source"] == "history" and output_format(args) == "table":
        note("counted from the whole history: no usage rollup yet (allocator usage --rebuild)")
    if unended and output_format(args) == "table":
        note(f"{unended} holding(s) ended unrecorded (a killed run no agent saw end): counted as 0")
    emit(document, output_format(args), _table(args.by, rows))
    return 0


def _rebuild(allocator: Allocator, now: datetime) -> None:
    from allocator.history.backfill import rebuild

    rows = rebuild(allocator.store, allocator.layout, allocator.on_bad_record, now)
    note(f"usage rollup rebuilt from history: {rows} holding(s) added")


def _table(by: str, rows: list[Any]) -> str:
    from allocator.cli.output import render_table

    if not rows:
        return "no GPUs were held in this window"
    cells = [
        [row.key, f"{row.gpu_hours:.2f}", f"{row.slot_hours:.2f}", str(row.holdings)]
        for row in rows
    ]
    return render_table([by.upper(), "GPU-HOURS", "SLOT-HOURS", "HOLDINGS"], cells)
