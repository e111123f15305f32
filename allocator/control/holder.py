"""Who holds an assignment, and which quota subjects and priority that holder has.

The holder is the store's authenticated user where the store has users and
the client's credential names one (etcd: the user of the store URL or
``ETCDCTL_USER``), else the operating system's user running the command.
Consul ACL tokens carry no user name a client can read without another
request, and SQLite has no users: there the OS user holds. A holder is a
key name (:func:`holder_key_name`), since it names quota counter keys.

A holder's subjects are ``user:NAME``, every ``team:T`` of the policy that
lists NAME, and every ``unix:G`` among the unix groups of NAME on this
machine, as the password and group databases say.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from allocator.control.actor import store_user
from allocator.policy.model import Policy
from allocator.records.keys import MAX_NAME_LENGTH
from allocator.util.identity import os_user

__all__ = [
    "asker_of",
    "holder_key_name",
    "holder_name",
    "needs_groups",
    "priority_of",
    "quota_subjects",
    "unix_groups",
]

_NOT_NAME = re.compile(r"[^A-Za-z0-9._-]", re.ASCII)


def holder_key_name(name: str) -> str:
    """``name`` as a valid key name: other characters become ``_`` (``uid 1000``: ``uid_1000``)."""
    cleaned = _NOT_NAME.sub("_", name)[:MAX_NAME_LENGTH].lstrip("-.") or "unknown"
    return cleaned


def holder_name(store_url: str | None) -> str:
    """Who this client holds its assignments as: the store's user, else the OS user."""
    return holder_key_name(store_user(store_url) or os_user())


def unix_groups(user: str) -> tuple[str, ...]:
    """The unix groups of ``user`` on this machine (none for a user it does not know)."""
    import grp
    import os
    import pwd

    try:
        entry = pwd.getpwnam(user)
        ids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, OSError):
        return ()
    names = []
    for gid in ids:
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return tuple(sorted(set(names)))


def _subjects_of(policy: Policy, holder: str, groups: Sequence[str]) -> set[str]:
    subjects = {f"user:{holder}"}
    subjects |= {f"team:{t.name}" for t in policy.teams.values() if holder in t.members}
    subjects |= {f"unix:{g}" for g in groups}
    return subjects


def quota_subjects(policy: Policy, holder: str, groups: Sequence[str]) -> tuple[str, ...]:
    """The subjects of ``holder`` that have a quota in ``policy``, sorted."""
    mine = _subjects_of(policy, holder, groups)
    return tuple(sorted({q.who for q in policy.quotas if q.who in mine}))


def priority_of(policy: Policy, holder: str, groups: Sequence[str], job: str | None) -> int:
    """The wait-queue priority of ``holder``'s request for ``job``: the highest rule's, else 0.

    ``job`` is ``None`` for a self-service request: its asker picks its job
    name, so job-name rules give it nothing; only rules naming who asks do.
    """
    mine = _subjects_of(policy, holder, groups)
    found = [
        rule.priority
        for rule in policy.priorities
        if mine.intersection(rule.who)
        or (job is not None and any(fnmatch.fnmatchcase(job, g) for g in rule.jobs))
    ]
    return max(found, default=0)


def asker_of(policy: Policy, holder: str, groups: Sequence[str]) -> tuple[str, ...]:
    """The subjects of ``holder`` that some reservation names (what placement's ``asker`` is)."""
    named = {w for r in policy.reservations for w in r.who}
    return tuple(sorted(named & _subjects_of(policy, holder, groups))) if named else ()


def needs_groups(policy: Policy) -> bool:
    """Whether a quota, priority, reservation or operator names a unix group (look them up)."""
    whos = [q.who for q in policy.quotas] + [w for r in policy.priorities for w in r.who]
    whos += [w for r in policy.reservations for w in r.who]
    whos += policy.operators
    return any(w.startswith("unix:") for w in whos)
