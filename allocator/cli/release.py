"""``allocator release``: take a job's GPUs back."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_words_command, note, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.assignments import Allocator

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
        "A damaged assignment record is removed too. Exits 6 if the job holds nothing. "
        "The reason goes into `allocator history`.",
    )


def run(args: argparse.Namespace) -> int:
    """Release and print what was released."""
    import json

    from allocator.cli.args import parse_release_args
    from allocator.cli.output import emit
    from allocator.errors import BadRecord

    job, host, reason = parse_release_args(args.words)
    allocator = open_allocator(args)
    try:
        if host is None:
            host = _host_of(allocator, job)
        released = allocator.release(host, job, reason=reason)
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


def _host_of(allocator: Allocator, job: str) -> str:
    """Where ``job`` is held, when host= was not given (``NotFound`` if nowhere)."""
    from allocator.assignments import job_not_found
    from allocator.errors import RequestError

    found, damaged = allocator.locate_job(job)
    hosts = sorted({a.host for a in found} | set(damaged))
    if len(hosts) == 1:
        return hosts[0]
    if len(hosts) > 1:
        raise RequestError(f"job {job!r} holds GPUs on {', '.join(hosts)}: say which with host=")
    raise job_not_found(job, None)
