"""``allocator release``: take a job's GPUs back."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_words_command, note, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.control.client import Allocator
    from allocator.errors import NotFound

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``release`` command."""
    add_words_command(
        commands,
        "release",
        run,
        help="release a job's GPUs on a host",
        usage="allocator release job=NAME [host=H] [reason=TEXT]",
        description="Remove a job's assignment; its host agent stops the job's workers. "
        "A damaged assignment record is removed too. A job across several hosts is released "
        "on all of them in one transaction. Exits 6 if the job holds nothing. "
        "The reason goes into `allocator history`.",
    )


def run(args: argparse.Namespace) -> int:
    """Release and print what was released."""
    import json

    from allocator.cli.args import parse_release_args
    from allocator.cli.output import emit
    from allocator.errors import BadRecord, NotFound

    job, host, reason = parse_release_args(args.words)
    allocator = open_allocator(args)
    try:
        try:
            host = host or _host_of(allocator, job)
            if host is None:  # a job across several hosts
                return _release_across(args, allocator, job, reason)
            released = allocator.release(host, job, reason=reason)
        except NotFound as missing:
            raise _waiting_hint(allocator, job, missing) from None
    finally:
        allocator.store.close()
    if isinstance(released, BadRecord):
        note(f"the record was damaged ({released.reason}); it is removed")
        data = {"job": job, "host": host, "damaged": released.reason}
        emit(data, output_format(args), f"released {job}@{host} (damaged record removed)")
        return 0
    where = "cpu" if released.mode == "cpu" else "gpus " + ",".join(map(str, released.gpus))
    emit(json.loads(released.to_json()), output_format(args), f"released {job}@{host} ({where})")
    return 0


def _host_of(allocator: Allocator, job: str) -> str | None:
    """Where ``job`` is held, when host= was not given (``NotFound`` if nowhere).

    ``None`` for a job across several hosts: it is released as a whole.
    """
    from allocator.control.job_index import locate_job
    from allocator.errors import RequestError
    from allocator.status.snapshots import job_not_found

    location = locate_job(allocator.store, allocator.layout, job, allocator.on_bad_record)
    if location.nodes or any(a.nodes for a in location.assignments):
        return None
    found, damaged = location.assignments, location.damaged
    hosts = sorted({a.host for a in found} | set(damaged))
    if len(hosts) == 1:
        return hosts[0]
    if len(hosts) > 1:
        raise RequestError(f"job {job!r} holds GPUs on {', '.join(hosts)}: say which with host=")
    raise job_not_found(job, None)


def _waiting_hint(allocator: Allocator, job: str, missing: NotFound) -> NotFound:
    """``missing``, pointing at ``allocator cancel`` when ``job`` waits in a queue."""
    from allocator.errors import NotFound
    from allocator.recipes.cancel import pending_entries

    hosts = sorted({w.entry.host for w in pending_entries(allocator, None) if w.entry.job == job})
    if not hosts:
        return missing
    where = ", ".join(hosts)
    return NotFound(f"{missing}; it waits in the queue of {where}: `allocator cancel job={job}`")


def _release_across(args: argparse.Namespace, allocator: Allocator, job: str, reason: str) -> int:
    """Release every share of a job across hosts, in one transaction."""
    import json

    from allocator.cli.output import emit
    from allocator.control.across_hosts import describe_shares

    result = allocator.release_across(job, reason=reason)
    for host in result.damaged:
        note(f"the record on {host} was damaged; it is removed")
    where = describe_shares(result.assignments) if result.assignments else "damaged records"
    data = {
        "job": job,
        "nodes": list(result.nodes),
        "released": list(result.released),
        "assignments": [json.loads(a.to_json()) for a in result.assignments],
    }
    hosts = ",".join(result.nodes or result.released)
    emit(data, output_format(args), f"released {job}@{hosts} ({where})")
    return 0
