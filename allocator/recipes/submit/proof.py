"""Whether a submitted job may run, and as whom: proven by the store, never claimed (pure).

A queue entry names its submission record (``<user>/<job>``); the record
lies under that user's own prefix. The agent runs the job only when:

* the record is there (a missing one is a forgery or a cancelled job);
* the entry's holder, the prefix's user and the record's user are one
  user, and the record is for this job and this host;
* the agent can start the command as that user: its own user, or, for an
  agent running as root on a store that proves names (etcd), any user this
  host knows; never as root unless the policy's ``submit_as_root`` names
  root.

On etcd with authentication and the per-user submission roles
(docs/queue.md), only the user's own credential can have written under the
user's prefix, so the name is proven by the store. On SQLite and Consul the
store proves no name: the agent's own user is the only one it runs as.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from allocator.records.holders import QueueEntry
from allocator.records.submission import Submission

__all__ = ["Runner", "refusal", "split_submission"]


def split_submission(pointer: str) -> tuple[str, str] | None:
    """``"<user>/<job>"`` as (user, job); ``None`` when it is not that shape."""
    user, slash, job = pointer.partition("/")
    if not slash or not user or not job or "/" in job:
        return None
    return user, job


@dataclass(frozen=True, slots=True)
class Runner:
    """Who the agent is: its OS user, whether it is root, and what its store proves."""

    user: str
    is_root: bool
    names_proven: bool  # etcd: a user's prefix is writable by that user's role alone
    root_allowed: Collection[str] = ()  # the policy's ``submit_as_root``


def refusal(entry: QueueEntry, record: Submission | None, runner: Runner) -> str | None:
    """Why the agent must not run ``entry`` (one line), or ``None`` when it may."""
    pointer = split_submission(entry.submission)
    if pointer is None:
        return f"its submission pointer {entry.submission!r} is not <user>/<job>"
    user, job = pointer
    if record is None:
        return f"there is no submission record {user}/{job} under {user}'s own prefix"
    if entry.holder != user or record.user != user:
        return (
            f"the entry names holder {entry.holder!r} but its record lies under {user!r}'s "
            f"prefix and names {record.user!r}"
        )
    if record.job != job or entry.job != job or record.host != entry.host:
        return f"the record {user}/{job} is for job {record.job!r} on {record.host!r}"
    return _identity_refusal(user, runner)


def _identity_refusal(user: str, runner: Runner) -> str | None:
    """Whether the agent can start a command as ``user``: itself, or (root) proven others."""
    if user == "root" and user not in runner.root_allowed:
        return "never as root: the policy's submit_as_root does not name root"
    if user == runner.user:
        return None
    if not runner.names_proven:
        return (
            f"this store proves no user's name: the agent runs submitted jobs of its own "
            f"user {runner.user!r} only, not {user!r}"
        )
    if not runner.is_root:
        return f"the agent runs as {runner.user!r}, not root: it cannot start a job as {user!r}"
    return None
