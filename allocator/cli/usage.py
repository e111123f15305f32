"""``allocator usage``: GPU-hours (and slot-hours) held, from history, like ``sreport``.

Every holding that history records (a ``set`` or ``move`` to its ``move`` or
``release``; one still open up to now) is counted for the time it overlaps
the window, grouped by who held it (``--by user``, the default), their team,
the job, the host's pool or the host. A holding whose command was killed
and whose lease expired has no end in history: it is counted as ending at
its start, and the report says how many there were. Whoever held it is
the assignment's holder where recorded, else the user who wrote it.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_common_options, note, open_allocator, output_format

__all__ = ["register"]

USAGE = "allocator usage [--since 30d|RFC3339] [--by user|team|job|pool|host] [-o json]"
_NO_TEAM = "(no team)"


def register(commands: Any) -> None:
    """Add the ``usage`` command."""
    from allocator.control.usage import BY

    parser = commands.add_parser(
        "usage", help="GPU-hours held per user, team, job, pool or host", usage=USAGE
    )
    parser.description = __doc__
    parser.add_argument("--since", metavar="WHEN", default="30d", help="window start (30d)")
    parser.add_argument("--by", choices=BY, default="user", help="group by (default: user)")
    add_common_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Read every host's history and the current assignments; print the totals."""
    from allocator.cli.output import emit
    from allocator.control.history import parse_since, read_history
    from allocator.control.usage import holdings, summarize
    from allocator.util.times import format_time, utc_now

    now = utc_now()
    since = parse_since(args.since, now)
    allocator = open_allocator(args)
    try:
        entries = read_history(
            allocator.store, allocator.layout, allocator.on_bad_record, with_policy=False
        )
        current = _current(allocator)
        snapshot = allocator.policy()
    finally:
        allocator.store.close()
    found = holdings(entries, current)
    policy = snapshot.policy if snapshot is not None else None
    rows = summarize(found, args.by, since, now, _grouper(args.by, policy))
    unended = sum(1 for h in found if h.ended_unrecorded and h.start >= since)
    if unended and output_format(args) == "table":
        note(f"{unended} holding(s) ended without a release entry (a killed run): counted as 0")
    document = {
        "since": format_time(since),
        "until": format_time(now),
        "by": args.by,
        "rows": [_row_document(row) for row in rows],
        "unended": unended,
    }
    emit(document, output_format(args), _table(args.by, rows))
    return 0


def _current(allocator: Any) -> dict[tuple[str, str], Any]:
    """Every assignment that exists now, keyed (host, job): one read of the hosts' keys."""
    from allocator.status.snapshots import snapshots_by_host

    listing = allocator.store.list(allocator.layout.hosts)
    hosts = snapshots_by_host(listing.items, allocator.layout, listing.revision)
    return {(h, job): a for h, snap in hosts.items() for job, a in snap.assignments.items()}


def _grouper(by: str, policy: Any) -> Any:
    """The function naming a holding's group for ``--by``."""
    if by == "user":
        return lambda h: h.holder
    if by == "job":
        return lambda h: h.job
    if by == "host":
        return lambda h: h.host
    if by == "pool":
        return lambda h: _pool(policy, h.host)
    return lambda h: _team(policy, h.holder)


def _pool(policy: Any, host: str) -> str:
    pool = policy.pool_of(host) if policy is not None else None
    return pool.name if pool is not None else "(no pool)"


def _team(policy: Any, user: str) -> str:
    """The policy's team of ``user`` (a ``teams:`` table of members, where the policy has one)."""
    teams = getattr(policy, "teams", None) or {}
    for name, team in sorted(teams.items()):
        members = getattr(team, "members", team)
        if user in members:
            return str(name)
    return _NO_TEAM


def _row_document(row: Any) -> dict[str, Any]:
    return {
        "key": row.key,
        "gpu_hours": round(row.gpu_hours, 6),
        "slot_hours": round(row.slot_hours, 6),
        "holdings": row.holdings,
        "jobs": sorted(row.jobs),
    }


def _table(by: str, rows: list[Any]) -> str:
    from allocator.cli.output import render_table

    if not rows:
        return "no GPUs were held in this window"
    cells = [
        [row.key, f"{row.gpu_hours:.2f}", f"{row.slot_hours:.2f}", str(row.holdings)]
        for row in rows
    ]
    return render_table([by.upper(), "GPU-HOURS", "SLOT-HOURS", "HOLDINGS"], cells)
