"""``allocator status``: who holds which GPU, on every host, in one read."""

from __future__ import annotations

import argparse
import sys
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
        description="One table of host, GPU, holder, slots, since, reason, health, reservation "
        "and idle time, joined with what each host's agent reports; then one line per job "
        "across several hosts (every share, its agent and its workers), idle holders (past "
        "their policy's idle rule) and processes on GPUs nobody was given. Reads every host "
        "at one revision, in a few range reads (the policy's, then a fleet's hosts in parts).",
    )


def run(args: argparse.Namespace) -> int:
    """Read everything once, join, print."""
    import gc

    # A fleet's status makes some 100,000 objects that all live until it has
    # printed: the cyclic collector would only walk them again and again.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _show(args)
    finally:
        if collecting:
            gc.enable()


def _show(args: argparse.Namespace) -> int:
    from allocator.cli.args import parse_key_values
    from allocator.records.keys import validate_name
    from allocator.status.read import read_status

    kv = parse_key_values(args.words, ("host",))
    only_host = validate_name(kv["host"], "host") if "host" in kv else None
    fmt = output_format(args)
    allocator = open_allocator(args)
    now = allocator.clock()
    layout = allocator.layout
    written: dict[str, bytes] = {}  # -o json: each host's part of the document

    def join(policy: Any, items: Any, declared: Any) -> list[Any]:
        from allocator.status.documents import status_host_json
        from allocator.status.join import status_of_part

        hosts = status_of_part(policy, items, layout, now, declared, only_host)
        if fmt == "json":  # written while etcd still sends the next part
            written.update((host.host, status_host_json(host)) for host in hosts)
        return hosts

    from allocator.control.queue_view import queue_lines, queue_prefix

    queue_read: list[Any] = []  # read with the policy (none where the user may not read it)
    try:
        prefix = layout.host(only_host) if only_host else layout.hosts
        _policy, revision, hosts = read_status(
            allocator,
            prefix,
            only_host=only_host,
            while_reading=_load_joining_and_printing,
            join=join,
            queue=(queue_prefix(layout, only_host), queue_read.append),
        )
        waiting = queue_lines(allocator, now, only_host, queue_read[0]) if queue_read else []
    finally:
        allocator.store.close()
    # Loaded by now (see read_status): these cost nothing here.
    from allocator.cli.output import emit, render_table
    from allocator.status.documents import status_document, status_json
    from allocator.status.join import group_status

    hosts.sort(key=_host_name)  # parts are cut by key, rows go by host name
    # With host= only that host was read: the other shares are unknown, not missing.
    groups = group_status(hosts) if only_host is None else []
    queue = [q.to_dict() for q in waiting]
    pieces = (
        status_json([written[h.host] for h in hosts], revision, groups, queue) if written else None
    )
    if pieces is not None:
        _write_ascii(pieces)
    elif fmt in ("json", "yaml"):  # build only what is printed: on a fleet either is large
        emit(status_document(hosts, revision, groups, queue), fmt)
    else:
        emit(None, fmt, _text(hosts, render_table, groups) + _queue_section(waiting))
    return 0


def _load_joining_and_printing() -> None:
    """Import the modules that join and print status (while etcd prepares its answer)."""
    import importlib

    for name in ("allocator.status.join", "allocator.status.documents", "allocator.cli.output"):
        importlib.import_module(name)


def _queue_section(waiting: Any) -> str:
    """The requests waiting for GPUs, one line each (nothing when none waits)."""
    if not waiting:
        return ""
    lines = [
        f"{q.host}: waiting #{q.position} {q.job} ({q.holder}, {q.requested}) since {q.since}: "
        f"{q.why}"
        for q in waiting
    ]
    return "\n\n" + "\n".join(lines)


def _write_ascii(pieces: list[bytes]) -> None:
    """Write ASCII ``pieces`` to stdout: to its bytes below when it has them (no copy)."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text stream of the caller's (the CLI run in-process)
        sys.stdout.write(b"".join(pieces).decode("ascii"))
        return
    sys.stdout.flush()
    buffer.writelines(pieces)


def _host_name(host: Any) -> str:
    return str(host.host)


def _text(hosts: Any, render_table: Any, groups: Any = ()) -> str:
    if not hosts:
        return "no hosts (apply a policy with `allocator policy apply FILE`)"
    rows = [_gpu_cells(g) for h in hosts for g in h.gpus]
    headers = ["HOST", "GPU", "HOLDER", "SLOTS", "SINCE", "REASON", "HEALTH", "RESERVED", "IDLE"]
    table = render_table(headers, rows)
    agents = "\n".join(f"{h.host}: agent {h.agent}{_vendor(h)}" + _job_summary(h) for h in hosts)
    picked = "".join(
        f"\n{h.host}: {j.job} picked {j.gpus}: {j.picked}"
        for h in hosts
        for j in h.jobs
        if j.picked
    )
    bad = "".join(f"\n{h.host}: {line}" for h in hosts for line in h.bad_records)
    across = "\n\n" + "\n".join(g.summary() for g in groups) if groups else ""
    return f"{table}\n\n{agents}{picked}{bad}{_usage_sections(hosts)}{across}"


def _vendor(host: Any) -> str:
    if host.vendor_mismatch:
        return f", {host.vendor} GPUs (MISMATCH: {host.vendor_mismatch})"
    return f", {host.vendor} GPUs" if host.vendor else ""


def _gpu_cells(g: Any) -> list[str]:
    idle = f"{g.idle} !" if g.idle_holder else g.idle
    cells = [g.host, g.gpu, g.holder, g.slots, g.since, g.reason, g.health, g.reserved, idle]
    return [cell or "-" for cell in cells]


def _usage_sections(hosts: Any) -> str:
    """Idle holders (past their rule) and processes on GPUs nobody was given, if any."""
    from allocator.status.gpu_use import describe_unassigned
    from allocator.util.durations import format_duration

    idle = [
        f"  {h.host} {j.job}: idle for {format_duration(j.idle_seconds or 0)} ({j.idle_rule})"
        for h in hosts
        for j in h.jobs
        if j.idle_holder
    ]
    strays = [
        describe_unassigned(h.host, g.gpu, p) for h in hosts for g in h.gpus for p in g.unassigned
    ]
    text = _gave_up_section(hosts)
    if idle:
        text += "\n\nidle holders:\n" + "\n".join(idle)
    if strays:
        text += "\n\nunassigned GPU use:\n" + "\n".join(f"  {line}" for line in strays)
    return text


def _gave_up_section(hosts: Any) -> str:
    """Why each job the agent gave up on failed: its worker's last lines, and its log."""
    blocks = [
        f"  {h.host} {j.job} (log {j.log_path or 'unknown'}):\n"
        + "\n".join(f"    | {line}" for line in j.output_tail)
        for h in hosts
        for j in h.jobs
        if j.output_tail
    ]
    return "\n\ngave up, last output:\n" + "\n".join(blocks) if blocks else ""


def _job_summary(host: Any) -> str:
    parts = []
    for job in host.jobs:
        if job.matches is None:
            continue
        state = "in sync" if job.matches else "NOT in sync"
        parts.append(f"{job.job} {job.workers} ({state})")
    return ("; " + "; ".join(parts)) if parts else ""
