"""``allocator cancel``: end a job's waiting requests and running holdings (like ``scancel``).

``job=NAME`` ends that job wherever it waits or runs (``host=H``: only
there; ``user=U``: only that user's); ``--me`` every job of this user's. A
waiting request (``set --wait``, ``run --wait``, a submitted job) leaves the
queue: its waiter stops with "cancelled by USER" (exit 3), a submitted job
never starts. A running one is released with ``cancelled by USER`` in
history, and its workers get SIGTERM, then SIGKILL after their grace.
Another user's job only an operator may cancel (exit 5); nothing to cancel
is exit 6.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import TYPE_CHECKING, Any

from allocator.cli.common import add_words_command, open_allocator, output_format

if TYPE_CHECKING:
    from allocator.control.client import Allocator
    from allocator.policy.model import Policy
    from allocator.recipes.cancel import Chosen
    from allocator.recipes.queue.order import Waiting
    from allocator.records.types import Assignment

__all__ = ["register"]

USAGE = "allocator cancel job=NAME [host=H] [user=U] | --me [-o table|json|yaml]"
#: A worker's grace when the policy names no job of that name (a policy job's default).
DEFAULT_GRACE_S = 10.0


def register(commands: Any) -> None:
    """Add the ``cancel`` command."""
    parser = add_words_command(
        commands,
        "cancel",
        run,
        help="end a job's waiting requests and running holdings",
        usage=USAGE,
        description=__doc__,
    )
    parser.add_argument("--me", action="store_true", help="every job of this user's")


def run(args: argparse.Namespace) -> int:
    """Choose what the cancel ends, end it, print one line for each."""
    from allocator.cli.output import emit

    job, host, user = _parse(args.words, me=args.me)
    allocator = open_allocator(args)
    try:
        chosen = _choose(allocator, job, host, user)
        lines = _cancel(allocator, chosen)
    finally:
        allocator.store.close()
    data = {"cancelled": [{"job": j, "host": h, "state": s} for j, h, s, _ in lines]}
    emit(data, output_format(args), "\n".join(text for *_, text in lines))
    return 0


def _parse(words: list[str], *, me: bool) -> tuple[str | None, str | None, str | None]:
    """``(job, host, user)`` from the words; job ``None`` with ``--me`` (exit 2 if neither)."""
    from allocator.cli.args import parse_key_values
    from allocator.errors import InvalidInput
    from allocator.records.keys import validate_name

    kv = parse_key_values(words, ("job", "host", "user"))
    if me == ("job" in kv):
        raise InvalidInput("give job=NAME or --me (one of them)")
    if me and "user" in kv:
        raise InvalidInput("give user=NAME or --me, not both")
    job = validate_name(kv["job"], "job") if "job" in kv else None
    host = validate_name(kv["host"], "host") if "host" in kv else None
    user = validate_name(kv["user"], "user") if "user" in kv else None
    return job, host, user


def _choose(allocator: Allocator, job: str | None, host: str | None, user: str | None) -> Chosen:
    """Read the queue and the holdings (of ``host``, ``user``), choose what ends."""
    from allocator.control.owners import may_change
    from allocator.recipes.cancel import choose, pending_entries

    snapshot = allocator.policy()
    standing = allocator.standing(snapshot.policy if snapshot is not None else None)
    waiting = [w for w in pending_entries(allocator, host) if _theirs(w.entry.holder, user)]
    held = [a for a in _holdings(allocator, host) if _theirs(a.holder, user)]

    def allowed(holder: str) -> bool:
        if standing.acts_for_policy:
            return True
        return may_change(standing.rules, standing.holder, standing.groups, holder)

    return choose(waiting, held, job, allocator.holder, allowed)


def _theirs(holder: str, user: str | None) -> bool:
    return user is None or holder == user


def _holdings(allocator: Allocator, host: str | None) -> list[Assignment]:
    """Every assignment (of ``host``), as one read of the hosts' keys."""
    from allocator.status.snapshots import snapshots_by_host

    layout = allocator.layout
    listing = allocator.store.list(layout.host(host) if host else layout.hosts)
    hosts = snapshots_by_host(listing.items, layout, listing.revision)
    return [a for snap in hosts.values() for a in snap.assignments.values()]


def _cancel(allocator: Allocator, chosen: Chosen) -> list[tuple[str, str, str, str]]:
    """End ``chosen``: (job, host, state, the line said) for each thing ended."""
    from allocator.recipes.cancel import cancel_pending

    by = allocator.holder
    cancel_pending(allocator, chosen.pending, by)
    _forget_submissions(allocator, chosen.pending)
    lines = [_pending_line(w) for w in chosen.pending]
    snapshot = allocator.policy()
    policy = snapshot.policy if snapshot is not None else None
    across: set[str] = set()
    for held in chosen.running:
        if held.nodes:  # a job across hosts ends on all of them at once
            if held.job not in across:
                across.add(held.job)
                allocator.release_across(held.job, reason=f"cancelled by {by}")
        else:
            allocator.release(held.host, held.job, reason=f"cancelled by {by}")
        lines.append(_running_line(held, _grace(policy, held.job)))
    return lines


def _forget_submissions(allocator: Allocator, pending: list[Waiting]) -> None:
    """Delete the records of cancelled submitted jobs (else the host's agent sweeps them)."""
    from allocator.errors import AllocatorError
    from allocator.recipes.submit.proof import split_submission
    from allocator.store import Delete

    for waiting in pending:
        split = split_submission(waiting.entry.submission or "")
        if split is None:
            continue
        # Another user's record may be out of this user's reach on etcd: the agent's sweep.
        with contextlib.suppress(AllocatorError, ValueError):
            key = allocator.layout.submission(*split)
            allocator.store.txn([], [Delete(key)])


def _pending_line(waiting: Waiting) -> tuple[str, str, str, str]:
    entry = waiting.entry
    kind = "submitted job" if entry.submission else "waiting request"
    return entry.job, entry.host, "pending", f"cancelled {kind} {entry.job} on {entry.host}"


def _running_line(held: Assignment, grace: float) -> tuple[str, str, str, str]:
    text = (
        f"cancelled running job {held.job} on {held.host}: "
        f"its workers get SIGTERM, then SIGKILL after {grace:g}s"
    )
    return held.job, held.host, "running", text


def _grace(policy: Policy | None, job: str) -> float:
    spec = policy.jobs.get(job) if policy is not None else None
    return spec.grace_seconds if spec is not None else DEFAULT_GRACE_S
