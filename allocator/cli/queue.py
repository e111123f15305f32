"""``allocator queue``: the requests waiting for GPUs (like Slurm's ``squeue``).

Position (in its host's queue), host, holder, job, what it asked for, since
when, its priority (with the policy's ``fair_share``: its fair-share
factor and the decayed GPU-hours behind it, like Slurm's ``sprio``), and
why it waits: ``GPU 3 held by job 'train'``,
``over quota team-a 8/8 GPUs``, or the request ahead of it.
``user=NAME`` (a comma list) shows only the requests of those users, ``--me``
only this user's (who this command would wait as: the store's user, else
the OS user). ``allocator queue remove host=H entry=NAME`` deletes a stuck entry (one
whose waiter is gone but whose entry stayed: written without a lease).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_words_command, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.recipes.queue.view import QueueLine

__all__ = ["register"]

USAGE = (
    "allocator queue [host=H] [user=U | --me] [-o table|json|yaml]"
    " | allocator queue remove host=H entry=NAME"
)


def register(commands: Any) -> None:
    """Add the ``queue`` command."""
    parser = add_words_command(
        commands,
        "queue",
        run,
        help="show the requests waiting for GPUs (set --wait)",
        usage=USAGE,
        description=__doc__,
    )
    parser.add_argument("--me", action="store_true", help="only this user's requests")


def run(args: argparse.Namespace) -> int:
    """Read the queue (of one host, or all), print it."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit, render_table
    from allocator.recipes.queue.view import queue_lines
    from allocator.records.keys import validate_name
    from allocator.util.times import utc_now

    if args.words[:1] == ["remove"]:
        return _remove(args)
    kv = parse_key_values(args.words, ("host", "user"))
    host = validate_name(kv["host"], "host") if "host" in kv else None
    users = _users(kv.get("user"), me=args.me)
    allocator = open_allocator(args)
    try:
        lines = queue_lines(allocator, utc_now(), host)
        if args.me:
            users = (allocator.holder,)
    finally:
        allocator.store.close()
    if users:
        lines = [q for q in lines if q.holder in users]
    shares = any(q.fair_share is not None for q in lines)
    rows = [_row(q, shares) for q in lines]
    headers = ["POS", "HOST", "WHO", "JOB", "WHAT", "SINCE", "PRIO"]
    headers += ["FAIRSHARE", "USAGE", "WHY"] if shares else ["WHY"]
    text = render_table(headers, rows) if rows else "no requests are waiting"
    emit({"queue": [q.to_dict() for q in lines]}, output_format(args), text)
    return 0


def _row(q: QueueLine, shares: bool) -> list[str]:
    """One table row; ``shares``: with the fair-share columns (some entry has a factor)."""
    asked = q.requested + (" preemptible" if q.preemptible else "")
    row = [str(q.position), q.host, q.holder, q.job, asked, q.since, str(q.priority)]
    if shares:
        row += [
            "-" if q.fair_share is None else f"{q.fair_share:.3f}",
            "-" if q.usage is None else f"{q.usage:.1f}",
        ]
    return [*row, q.why]


def _users(raw: str | None, *, me: bool) -> tuple[str, ...]:
    """The users ``user=`` names (checked names); exit 2 with ``--me`` as well."""
    from allocator.errors import InvalidInput
    from allocator.status.filters import parse_filter

    if raw is None:
        return ()
    if me:
        raise InvalidInput("give user=NAME or --me, not both")
    return parse_filter({"user": raw}).users


def _remove(args: argparse.Namespace) -> int:
    """``queue remove host=H entry=NAME``: delete one entry; exit 6 if there is none."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.common import note
    from allocator.errors import InvalidInput
    from allocator.recipes.queue.view import remove_entry
    from allocator.records.keys import validate_name

    kv = parse_key_values(args.words[1:], ("host", "entry"))
    if "host" not in kv or "entry" not in kv:
        raise InvalidInput("queue remove needs host=H and entry=NAME (`allocator queue -o json`)")
    host = validate_name(kv["host"], "host")
    name = validate_name(kv["entry"], "queue entry")
    allocator = open_allocator(args)
    try:
        gone = remove_entry(allocator, host, name)
    finally:
        allocator.store.close()
    note(f"removed queue entry {name} on {host} ({gone.job or 'damaged'}, {gone.holder or '?'})")
    return 0
