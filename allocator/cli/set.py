"""``allocator set``: give a job GPUs (or the CPU) on a host."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocator.cli.common import (
    add_words_command,
    note,
    note_waiting,
    open_allocator,
    output_format,
)
from allocator.errors import RequestError

if TYPE_CHECKING:
    from allocator.cli.args import SetArgs
    from allocator.control.client import Allocator
    from allocator.placement.choose import Placement, Request
    from allocator.records.types import Assignment

__all__ = ["register"]

USAGE = (
    "allocator set job=NAME (gpus=1,3 | gpus=0-3 | gpus=cpu | count=N) [slots=K]"
    " [prefer=links] [host=H[,H2...]] [time=DURATION] [reason=TEXT] [command='ARGV']"
    " [--wait[=DURATION]]"
)


def register(commands: Any) -> None:
    """Add the ``set`` command."""
    parser = add_words_command(
        commands,
        "set",
        run,
        help="assign GPUs to a job on a host",
        usage=USAGE,
        description="Assign GPUs to a job. The write is one transaction checked against the "
        "applied policy and the host's current assignments: two operators racing for one GPU "
        "can never both win (the loser exits 3 naming the holder). host=node1,node2 makes one "
        "job across those hosts (count=N: N GPUs on each; gpus=LIST: the same GPUs on each; "
        "node ranks in the order given), written on all of them or on none. In a shared pool "
        "the job takes one slot of each GPU (slots=K: K of them); count=N there prefers GPUs "
        "with free slots to better links unless prefer=links. count=N says why it picked its "
        "GPUs. --wait: when the GPUs are not free (held, reserved, unhealthy or over a quota), "
        "wait in the host's queue and take them the moment it is this request's turn "
        "(--wait=30m: give up after that, exit 3); a job across hosts waits in every host's "
        "queue and takes all its shares at once, never part of them; see `allocator queue`. "
        "Without --wait, set is an operator's order: it may take GPUs that waiting requests "
        "could use, and says how many it passed (history names them). "
        "time=2h: the job ends then (its workers stopped, its GPUs released, history says "
        "`time limit`); the pool may set a default and a maximum.",
    )
    parser.add_argument(
        "--wait",
        nargs="?",
        const="",
        default=None,
        metavar="DURATION",
        help="wait in the queue for the GPUs (forever, or at most DURATION: 90s, 30m, 2h)",
    )


def run(args: argparse.Namespace) -> int:
    """Parse, place and write the assignment; print what was set."""
    from allocator.cli.args import parse_set_args
    from allocator.cli.output import emit
    from allocator.placement.choose import Request

    wait = _wait_seconds(args)
    parsed = parse_set_args(args.words)
    if parsed.time is not None and parsed.hosts:
        raise RequestError("time= limits a job on one host; a job across hosts has no limit yet")
    if parsed.hosts:
        return _run_across(args, parsed, wait)
    allocator = open_allocator(args)
    try:
        request = Request(
            job=parsed.job,
            host=parsed.host or "",
            gpus=parsed.gpus,
            count=parsed.count,
            cpu=parsed.cpu,
            slots=parsed.slots,
            prefer=parsed.prefer,
            time=parsed.time,
        )
        if wait is None:
            assignment, placement = _assign_passing(allocator, request, parsed)
        else:
            from allocator.recipes.queue.wait import wait_and_assign

            assignment, placement = wait_and_assign(
                allocator,
                request,
                reason=parsed.reason,
                command=parsed.command,
                timeout=wait if wait > 0 else None,
                on_wait=note_waiting,
            )
    finally:
        allocator.store.close()
    if placement.picked:
        note(f"picked {','.join(map(str, placement.gpus))}: {placement.picked}")
    for message in placement.notes:
        note(message)
    if assignment.fallback_reason:
        note(f"running on CPU: {assignment.fallback_reason}")
    where = "cpu" if assignment.mode == "cpu" else "gpus " + ",".join(map(str, assignment.gpus))
    emit(_as_dict(assignment), output_format(args), f"{assignment.job}@{assignment.host}: {where}")
    return 0


def _assign_passing(
    allocator: Allocator, request: Request, parsed: SetArgs
) -> tuple[Assignment, Placement]:
    """An operator's direct ``set``: it may take GPUs waiting requests could use, and says so."""
    from allocator.recipes.queue.passage import QueuePass, passed_line

    gate = QueuePass(allocator)
    done = allocator.assign(request, reason=parsed.reason, command=parsed.command, gate=gate)
    if gate.passed:
        note(passed_line(len(gate.passed), gate.host))
    return done


def _wait_seconds(args: argparse.Namespace) -> float | None:
    """``--wait``: 0 for forever, else the seconds of its duration; ``None`` when absent.

    ``--wait job=x`` (no ``=``) reads ``job=x`` as the next word, not as a duration.
    """
    from allocator.util.durations import parse_duration

    raw = getattr(args, "wait", None)
    if raw is None:
        return None
    if "=" in raw:
        args.words.insert(0, raw)
        return 0.0
    if not raw:
        return 0.0
    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise RequestError(f"--wait: {exc}") from None
    if seconds <= 0:
        raise RequestError("--wait: give a duration above zero (or none, to wait forever)")
    return seconds


def _run_across(args: argparse.Namespace, parsed: Any, wait: float | None) -> int:
    """``host=a,b``: one job across those hosts, in one transaction (``--wait``: as a gang)."""
    from allocator.cli.output import emit
    from allocator.control.across_hosts import describe_shares
    from allocator.placement.choose import Request

    request = Request(
        job=parsed.job,
        host="",
        gpus=parsed.gpus,
        count=parsed.count,
        cpu=parsed.cpu,
        slots=parsed.slots,
        prefer=parsed.prefer,
    )
    allocator = open_allocator(args)
    try:
        if wait is None:
            result = allocator.assign_across(
                request, parsed.hosts, reason=parsed.reason, command=parsed.command
            )
        else:
            from allocator.recipes.queue.wait import wait_and_assign_across

            result = wait_and_assign_across(
                allocator,
                request,
                parsed.hosts,
                reason=parsed.reason,
                command=parsed.command,
                timeout=wait if wait > 0 else None,
                on_wait=note_waiting,
            )
    finally:
        allocator.store.close()
    for message in result.notes:
        note(message)
    first = result.assignments[0]
    if first.fallback_reason:
        note(f"running on CPU: {first.fallback_reason}")
    text = (
        f"{result.job}@{','.join(result.nodes)}: {describe_shares(result.assignments)} "
        f"({len(result.nodes)} nodes, MASTER_PORT {result.master_port})"
    )
    emit(_group_dict(result), output_format(args), text)
    return 0


def _group_dict(result: Any) -> dict[str, Any]:
    """The JSON form of a job across hosts: its nodes, port and every share."""
    return {
        "job": result.job,
        "nodes": list(result.nodes),
        "master_port": result.master_port,
        "assignments": [_as_dict(a) for a in result.assignments],
        "released": list(result.released),
    }


def _as_dict(assignment: Any) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(assignment.to_json())
    return data
