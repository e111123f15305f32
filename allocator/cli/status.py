"""``allocator status``: who holds which GPU, on every host, in one read."""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``status`` command."""
    add_words_command(
        commands,
        "status",
        run,
        help="show every GPU, its holder, and each host agent's state",
        usage="allocator status [host=H] [-o table|json|yaml]",
        description="One table of host, GPU, holder, since and reason, joined with what each "
        "host's agent reports. Reads every host in one range read.",
    )


def run(args: argparse.Namespace) -> int:
    """Read everything once, join, print."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit, render_table
    from allocator.documents import status_document
    from allocator.keys import validate_name
    from allocator.status import build_status

    kv = parse_key_values(args.words, ("host",))
    only_host = validate_name(kv["host"], "host") if "host" in kv else None
    allocator = open_allocator(args)
    try:
        snapshot = _policy_if_readable(allocator)
        prefix = allocator.layout.host(only_host) if only_host else allocator.layout.hosts
        listing = allocator.store.list(prefix)
    finally:
        allocator.store.close()
    hosts = build_status(
        snapshot.policy if snapshot else None,
        listing.items,
        allocator.layout,
        allocator.clock(),
        only_host,
    )
    data = status_document(hosts, listing.revision)
    emit(data, output_format(args), _text(hosts, render_table))
    return 0


def _policy_if_readable(allocator: Any) -> Any:
    """The applied policy; a damaged policy record is noted and status goes on without it.

    Status is what an operator reads to find out what is wrong, so it must
    not be the command that stops working when something is.
    """
    from allocator.errors import BadRecord

    try:
        return allocator.policy()
    except BadRecord as exc:
        allocator.on_bad_record(exc)
        return None


def _text(hosts: Any, render_table: Any) -> str:
    if not hosts:
        return "no hosts (apply a policy with `allocator policy apply FILE`)"
    rows = [
        [g.host, g.gpu, g.holder, g.since or "-", g.reason or "-", g.health, g.reserved or "-"]
        for h in hosts
        for g in h.gpus
    ]
    table = render_table(["HOST", "GPU", "HOLDER", "SINCE", "REASON", "HEALTH", "RESERVED"], rows)
    agents = "\n".join(f"{h.host}: agent {h.agent}" + _job_summary(h) for h in hosts)
    bad = "".join(f"\n{h.host}: {line}" for h in hosts for line in h.bad_records)
    return f"{table}\n\n{agents}{bad}"


def _job_summary(host: Any) -> str:
    parts = []
    for job in host.jobs:
        if job.matches is None:
            continue
        state = "in sync" if job.matches else "NOT in sync"
        parts.append(f"{job.job} {job.workers} ({state})")
    return ("; " + "; ".join(parts)) if parts else ""
