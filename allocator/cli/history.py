"""``allocator history``: who changed which assignment, when and why, newest first.

Every ``set``, ``release`` and ``policy apply`` writes its entry in the same
transaction as the change, and each host's agent adds its own decisions
(fallback to the CPU, recovery, giving up, holding a flapping job back).
Entries are kept per host, up to the policy's ``history.entries_per_host``,
and no older than its ``history.max_age``. ``allocator history prune`` drops
the entries past that age from streams nobody appends to any more (hosts
that left the policy lose their stream): run it now and then, e.g. daily.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_words_command, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.history.stream import Stored

__all__ = ["register"]

USAGE = (
    "allocator history [job=J] [host=H] [gpu=N] [--since 30m|2h|7d|RFC3339] [--limit N] "
    "[-o table|json|yaml]\n       allocator history prune [-o table|json|yaml]"
)
#: More than this many entries is no screenful: a typo, or a fleet's whole history.
_MAX_LIMIT = 10_000_000


def register(commands: Any) -> None:
    """Add the ``history`` command."""
    parser = add_words_command(
        commands,
        "history",
        run,
        help="show every assignment change and policy apply, newest first",
        usage=USAGE,
        description=__doc__,
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only entries from this far back (30m, 2h, 7d, 1w) or since an RFC 3339 time",
    )
    parser.add_argument(
        "--limit", metavar="N", help="show at most N entries (the newest)", default=None
    )


def run(args: argparse.Namespace) -> int:
    """Read the newest entries the filters select (no more than shown), print."""
    if args.words[:1] == ["prune"]:
        return _prune(args)
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit, render_table
    from allocator.history.read import query_history
    from allocator.history.stream import parse_since
    from allocator.records.keys import validate_name
    from allocator.status.documents import history_document
    from allocator.util.times import utc_now

    kv = parse_key_values(args.words, ("job", "host", "gpu"))
    job = validate_name(kv["job"], "job") if "job" in kv else None
    host = validate_name(kv["host"], "host") if "host" in kv else None
    gpu = _gpu(kv["gpu"]) if "gpu" in kv else None
    since = parse_since(args.since, utc_now()) if args.since is not None else None
    limit = _limit(args.limit) if args.limit is not None else None
    allocator = open_allocator(args)
    try:
        chosen = query_history(
            allocator.store,
            allocator.layout,
            allocator.on_bad_record,
            host=host,
            job=job,
            gpu=gpu,
            since=since,
            limit=limit,
            now=allocator.clock(),
        )
    finally:
        allocator.store.close()
    emit(history_document(chosen), output_format(args), _table(chosen, render_table))
    return 0


def _prune(args: argparse.Namespace) -> int:
    """Drop entries past ``history.max_age`` from every stream; print what went."""
    from allocator.cli.output import emit
    from allocator.errors import InvalidInput
    from allocator.history.prune import prune_history
    from allocator.util.durations import duration_text

    if len(args.words) > 1 or args.since is not None or args.limit is not None:
        raise InvalidInput("history prune takes no filters: allocator history prune [-o json]")
    allocator = open_allocator(args)
    try:
        policy = allocator.require_policy().policy
        max_age = policy.history.max_age_seconds
        if max_age is None:
            raise InvalidInput(
                "the applied policy sets no history.max_age, so no entry is too old to keep: "
                "add history: {max_age: 30d} and apply it"
            )
        done = prune_history(
            allocator.store,
            allocator.layout,
            frozenset(policy.hosts),
            max_age,
            allocator.clock(),
            allocator.on_bad_record,
        )
    finally:
        allocator.store.close()
    age = duration_text(max_age)
    document = {
        "max_age": age,
        "streams": done.streams,
        "entries_dropped": done.entries,
        "streams_pruned": done.pruned_streams,
        "streams_removed": list(done.removed),
        "index_hours_dropped": done.index_hours,
    }
    text = (
        f"dropped {done.entries:,} entries older than {age} from {done.pruned_streams:,} of "
        f"{done.streams:,} streams; removed {len(done.removed):,} streams of hosts the policy "
        "no longer declares" + (f" ({', '.join(done.removed[:5])}" if done.removed else "")
    )
    if done.removed:
        text += ", ...)" if len(done.removed) > 5 else ")"
    emit(document, output_format(args), text)
    return 0


def _gpu(raw: str) -> int:
    from allocator.cli.args import parse_gpu_list
    from allocator.errors import InvalidInput

    gpus = parse_gpu_list(raw)
    if len(gpus) != 1:
        raise InvalidInput(f"gpu={raw[:40]}: give one GPU index (e.g. gpu=3)")
    return gpus[0]


def _limit(raw: str) -> int:
    from allocator.errors import InvalidInput

    if not raw.isascii() or not raw.isdigit() or len(raw) > 8 or not 1 <= int(raw) <= _MAX_LIMIT:
        raise InvalidInput(f"--limit {raw[:20]}: expected a whole number from 1 to {_MAX_LIMIT:,}")
    return int(raw)


def _table(entries: list[Stored], render_table: Any) -> str:
    if not entries:
        return "no history matches"
    rows = [_row(stored) for stored in entries]
    return str(render_table(["WHEN", "HOST", "JOB", "ACTION", "FROM", "TO", "BY", "REASON"], rows))


def _row(stored: Stored) -> list[str]:
    entry = stored.entry
    if entry.action == "policy-apply":
        old = f"sha256 {entry.previous_sha256[:12]}" if entry.previous_sha256 else "-"
        new = f"sha256 {entry.policy_sha256[:12]}" if entry.policy_sha256 else "-"
    else:
        old, new = _where(entry.from_mode, entry.from_gpus), _where(entry.to_mode, entry.to_gpus)
    ended = ""
    if entry.exit_status is not None:
        ended = f"exit {entry.exit_status}, {entry.gpu_seconds or 0:.0f} GPU-seconds"
    elif entry.gpu_seconds is not None:  # an expired run's: its exit status is unknown
        ended = f"{entry.gpu_seconds:.0f} GPU-seconds"
    why = "; ".join(part for part in (entry.reason, entry.detail, ended) if part) or "-"
    return [entry.at, entry.host or "-", entry.job or "-", entry.action, old, new, entry.by, why]


def _where(mode: str | None, gpus: tuple[int, ...]) -> str:
    if mode is None:
        return "-"
    if mode == "gpu":
        return ",".join(str(gpu) for gpu in gpus) or "-"
    return mode
