"""``allocator status``: who holds which GPU, on every host, in one read."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format
from allocator.errors import InvalidInput

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``status`` command."""
    parser = add_words_command(
        commands,
        "status",
        run,
        help="show every GPU, its holder, and each host agent's state",
        usage="allocator status [host=PATTERN] [pool=P] [job=J] [state=S] [user=U | --me] "
        "[--summary] [-o table|json|yaml]",
        description="One table of host, GPU, the job holding it and its user, slots, since, "
        "reason, health, reservation and idle time, joined with what each host's agent "
        "reports; then one line per job across several hosts (every share, its agent and "
        "its workers), idle holders (past their policy's idle rule) and processes on GPUs "
        "nobody was given. Reads every host at one revision, in a few range reads (the "
        "policy's, then a fleet's hosts in parts). Filters (comma lists; different keys "
        "must all match): host= a name, a glob (node0*) or a range (node[0000-0099]); pool=; "
        "job=; state=free|held|idle|unhealthy|fallback; user= who holds the GPUs (--me: the "
        "user this command would hold them as). host=, pool= and job= read only the hosts "
        "they pick.",
    )
    parser.add_argument(
        "--me",
        action="store_true",
        help="only the GPUs held by this user (the store's user, else the OS user), as user= would",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="one row of totals per pool (hosts, GPUs free, held, idle, unhealthy, ...)",
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
    from allocator.status.filters import FILTER_KEYS, parse_filter, plain_host_names
    from allocator.status.read import read_status

    wanted = parse_filter(parse_key_values(args.words, FILTER_KEYS))
    if getattr(args, "me", False) and wanted.users:
        raise InvalidInput("give user=NAME or --me, not both")
    names = plain_host_names(wanted.hosts) if wanted.hosts else None
    # One host named (alone or with state=): its prefix alone, read as always
    # (and shown even if undeclared); pool= and job= pick hosts from the policy.
    alone = names is not None and len(names) == 1 and not (wanted.pools or wanted.jobs)
    only_host = names[0] if names is not None and alone else None
    summary = bool(getattr(args, "summary", False))
    fmt = output_format(args)
    allocator = open_allocator(args)
    if getattr(args, "me", False):
        from msgspec.structs import replace

        wanted = replace(wanted, users=(allocator.holder,))
    now = allocator.clock()
    layout = allocator.layout
    written: dict[str, bytes] = {}  # -o json: each host's part of the document
    pools: list[dict[str, str]] = []  # each host's pool, once the policy is decoded
    # --summary counts from the keys (no rows) unless it must pick GPU rows first
    counting = summary and not wanted.trims_rows

    def _count(policy: Any, items: Any, declared: Any) -> list[Any]:
        from allocator.status.filters import host_matcher
        from allocator.status.summary_count import count_part

        found = _pools(pools, policy)
        names = [only_host] if only_host is not None else declared
        counts = count_part(policy, items, layout, now, names, found)
        if wanted.hosts:
            matches = host_matcher(wanted.hosts)
            counts = [c for c in counts if matches(c.host)]
        if wanted.pools:
            counts = [c for c in counts if c.counts.pool in wanted.pools]
        return counts

    def join(policy: Any, items: Any, declared: Any) -> list[Any]:
        if counting:
            return _count(policy, items, declared)
        from allocator.status.documents import status_host_json
        from allocator.status.filters import filter_hosts
        from allocator.status.join import status_of_part

        hosts = status_of_part(policy, items, layout, now, declared, only_host)
        if not wanted.empty:
            hosts = filter_hosts(hosts, wanted, _pools(pools, policy))
        if fmt == "json" and not summary:  # written while etcd still sends the next part
            written.update((host.host, status_host_json(host)) for host in hosts)
        return hosts

    from allocator.recipes.queue.view import queue_prefix

    queue_read: list[Any] = []  # read with the policy (none where the user may not read it)
    pick = _picker(allocator, wanted, pools) if only_host is None else None
    counter = None  # --summary of many hosts: from the counts agents write, where they do
    if counting and only_host is None:
        from allocator.status.summary_read import CountsPicker

        pick = counter = CountsPicker(allocator, now, lambda policy: _pools(pools, policy), pick)
    try:
        prefix = layout.host(only_host) if only_host else layout.hosts
        policy, revision, hosts = read_status(
            allocator,
            prefix,
            only_host=only_host,
            while_reading=_load_joining_and_printing,
            join=join,
            queue=(queue_prefix(layout, only_host), queue_read.append),
            pick=pick,
        )
        if summary:
            hosts += counter.reported if counter is not None else []
            found = _pools(pools, policy)
            return _print_summary(
                hosts, found, layout.queue, queue_read, revision, fmt, counted=counting
            )
        waiting = _waiting(allocator, now, only_host, queue_read, wanted, hosts)
    finally:
        allocator.store.close()
    # Loaded by now (see read_status): these cost nothing here.
    from allocator.cli.output import emit, render_table
    from allocator.status.documents import status_document, status_json

    hosts.sort(key=_host_name)  # parts are cut by key, rows go by host name
    groups = _groups(hosts, only_host, wanted)
    queue = [q.to_dict() for q in waiting]
    pieces = (
        status_json([written[h.host] for h in hosts], revision, groups, queue) if written else None
    )
    if pieces is not None:
        _write_ascii(pieces)
    elif fmt in ("json", "yaml"):  # build only what is printed: on a fleet either is large
        emit(status_document(hosts, revision, groups, queue), fmt)
    else:
        text = _text(hosts, render_table, groups, filtered=not wanted.empty)
        emit(None, fmt, text + _queue_section(waiting))
    return 0


def _pools(found: list[dict[str, str]], policy: Any) -> dict[str, str]:
    """Each host's pool under ``policy`` (worked out once, kept in ``found``)."""
    if not found:
        from allocator.status.filters import pool_by_host

        found.append(pool_by_host(policy))
    return found[0]


def _picker(allocator: Any, wanted: Any, pools: list[dict[str, str]]) -> Any:
    """What ``read_status`` calls with the policy: the hosts ``wanted`` must read, or ``None``.

    An unknown ``pool=`` is invalid input (exit 2); ``job=`` finds its hosts
    in the job index (every host is read for a job without a usable entry: a
    store written before the index, or an entry damaged by hand).
    """
    if not (wanted.hosts or wanted.pools or wanted.jobs):
        return None

    def pick(policy: Any) -> list[str] | None:
        from allocator.errors import InvalidInput
        from allocator.status.filters import hosts_to_read

        for pool in wanted.pools:
            if policy is None or pool not in policy.pools:
                raise InvalidInput(f"pool={pool}: no such pool in the applied policy")
        declared = policy.hosts if policy is not None else ()
        from allocator.status.read_hosts import job_hosts

        found = job_hosts(allocator, wanted.jobs) if wanted.jobs else None
        return hosts_to_read(wanted, declared, _pools(pools, policy), found)

    return pick


def _waiting(
    allocator: Any, now: Any, only_host: str | None, queue_read: list[Any], wanted: Any, hosts: Any
) -> list[Any]:
    """The waiting requests to show: for the hosts shown (and ``job=``'s jobs) when filtered."""
    from allocator.recipes.queue.view import queue_lines

    if not queue_read:
        return []
    listing = queue_read[0]
    if wanted.hosts or wanted.pools or wanted.jobs or wanted.states:
        from allocator.records.keys import split_host_key

        shown = {h.host for h in hosts}
        items = tuple(
            item
            for item in listing.items
            if (parsed := split_host_key(item.key, allocator.layout.queue)) and parsed[0] in shown
        )
        listing = type(listing)(items, listing.revision, listing.bad_keys)
    lines = queue_lines(allocator, now, only_host, listing)
    return [
        q
        for q in lines
        if (not wanted.jobs or q.job in wanted.jobs)
        and (not wanted.users or q.holder in wanted.users)
    ]


def _groups(hosts: Any, only_host: str | None, wanted: Any) -> list[Any]:
    """Jobs across hosts: only where every share was read whole (not with host=/pool=/state=)."""
    from allocator.status.join import group_status

    if only_host is not None or wanted.hosts or wanted.pools or wanted.states:
        return []  # the other shares are unknown (or trimmed away), not missing
    groups = group_status(hosts)
    return [g for g in groups if g.job in wanted.jobs] if wanted.jobs else groups


def _print_summary(
    hosts: Any,
    pools: dict[str, str],
    queue: str,
    queue_read: list[Any],
    revision: int,
    fmt: str,
    *,
    counted: bool,
) -> int:
    """``--summary``: totals per pool, as a table or a document."""
    from allocator.cli.output import emit, render_table
    from allocator.status.summary import (
        queued_by_host,
        summarize,
        summary_document,
        summary_table,
    )

    queued = queued_by_host(queue_read[0].items if queue_read else (), queue)
    if counted:  # each host's counts already (allocator.status.summary_count)
        from allocator.status.summary_count import summary_of_counts

        summary = summary_of_counts(hosts, queued, revision)
    else:
        summary = summarize(hosts, pools, queued, revision)
    if fmt in ("json", "yaml"):
        emit(summary_document(summary), fmt)
    else:
        emit(None, fmt, summary_table(summary, render_table))
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


#: The GPU table's columns: JOB is the job holding the GPU, USER its holder (who took it).
_GPU_HEADERS = (
    "HOST",
    "GPU",
    "JOB",
    "USER",
    "SLOTS",
    "SINCE",
    "REASON",
    "HEALTH",
    "RESERVED",
    "IDLE",
)


def _text(hosts: Any, render_table: Any, groups: Any = (), *, filtered: bool = False) -> str:
    if not hosts and not filtered:
        return "no hosts (apply a policy with `allocator policy apply FILE`)"
    gpus = [g for h in hosts for g in h.gpus]
    headers: tuple[str, ...] = _GPU_HEADERS
    rows = [_gpu_cells(g) for g in gpus]
    if any(g.time_left for g in gpus):  # the column only where some holding has a limit
        headers = (*headers, "TIME LEFT")
        rows = [[*cells, g.time_left or "-"] for cells, g in zip(rows, gpus, strict=True)]
    table = render_table(headers, rows)
    if not hosts:  # filtered to nothing: the header alone, as squeue prints it
        return str(table)
    agents = "\n".join(f"{h.host}: agent {h.agent}{_vendor(h)}" + _job_summary(h) for h in hosts)
    # Why count=N picked its GPUs is said once, by `set`; -o json keeps it (``picked``).
    bad = "".join(f"\n{h.host}: {line}" for h in hosts for line in h.bad_records)
    across = "\n\n" + "\n".join(g.summary() for g in groups) if groups else ""
    return f"{table}\n\n{agents}{bad}{_usage_sections(hosts)}{across}"


def _vendor(host: Any) -> str:
    # An agent that saw no GPU (no NVML, say) knows no vendor: the name would be the policy's.
    if host.inventory == "declared":
        return ", GPUs not seen (no GPU library answered; the policy's count stands in)"
    if host.inventory == "none":
        return ", no GPUs found"
    if host.vendor_mismatch:
        return f", {host.vendor} GPUs (MISMATCH: {host.vendor_mismatch})"
    return f", {host.vendor} GPUs" if host.vendor else ""


def _gpu_cells(g: Any) -> list[str]:
    idle = f"{g.idle} !" if g.idle_holder else g.idle
    cells = [
        g.host,
        g.gpu,
        g.holder,
        g.user,
        g.slots,
        g.since,
        g.reason,
        g.health,
        g.reserved,
        idle,
    ]
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
        if host.agent not in ("alive", "stale"):
            # No agent keeps the record: it is what one said before it went, not now.
            parts.append(f"{job.job} last reported {job.workers}")
            continue
        state = "in sync" if job.matches else "NOT in sync"
        parts.append(f"{job.job} {job.workers} ({state})")
    return ("; " + "; ".join(parts)) if parts else ""
