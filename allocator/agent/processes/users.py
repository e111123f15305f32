"""Which user and groups a job's workers run as: the policy's ``user:``/``group:`` resolved here.

An agent running as root starts a job that names a user as that user: its
uid, the named group (else the user's primary group) and the user's
supplementary groups from the user database (``os.getgrouplist``), with
``HOME``, ``USER`` and ``LOGNAME`` from its passwd entry, the way
``systemd``'s ``User=`` and ``su -`` do. A job that names no one runs as
the agent. A name the host does not know, or a non-root agent asked to run
a job as someone else, is a :class:`RunAsError` with one clear line.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

__all__ = ["RunAs", "RunAsError", "identity_env", "resolve_run_as"]


class RunAsError(Exception):
    """The job's ``user``/``group`` cannot be used on this host (the message says why)."""


@dataclass(frozen=True, slots=True)
class RunAs:
    """A resolved identity for a job's workers."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, the primary one included
    home: str

    def shim_argument(self) -> str:
        """The shim's RUNAS argument: ``uid:gid:g1,g2``."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


def resolve_run_as(
    user: str | None,
    group: str | None,
    *,
    job: str,
    euid: int | None = None,
    egid: int | None = None,
) -> RunAs | None:
    """The identity ``job``'s workers run as; None to run them as the agent itself.

    ``euid``/``egid`` default to the agent's own; an agent that is not root
    may only "switch" to the identity it already has.
    """
    if user is None and group is None:
        return None
    euid = os.geteuid() if euid is None else euid
    egid = os.getegid() if egid is None else egid
    entry = _passwd(user, job) if user is not None else _passwd(str(euid), job)
    gid = _group_id(group, job) if group is not None else entry.pw_gid
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, gid))))
    wanted = RunAs(entry.pw_name, entry.pw_uid, gid, groups, entry.pw_dir)
    if euid != 0 and (wanted.uid != euid or wanted.gid != egid):
        raise RunAsError(
            f"job {job!r} runs as {_describe(user, group)} but the agent runs as uid {euid} "
            "and only root may start workers as another user or group; run the agent as "
            f"root or drop user/group from job {job!r}"
        )
    return wanted


def identity_env(run_as: RunAs | None) -> dict[str, str]:
    """``HOME``, ``USER`` and ``LOGNAME`` of the identity (none when running as the agent)."""
    if run_as is None:
        return {}
    return {"HOME": run_as.home, "USER": run_as.user, "LOGNAME": run_as.user}


def _passwd(user: str, job: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise RunAsError(f"job {job!r}: user {user!r} does not exist on this host") from None


def _group_id(group: str, job: str) -> int:
    try:
        return (grp.getgrgid(int(group)) if group.isdigit() else grp.getgrnam(group)).gr_gid
    except (KeyError, OverflowError):
        raise RunAsError(f"job {job!r}: group {group!r} does not exist on this host") from None


def _describe(user: str | None, group: str | None) -> str:
    parts = ([f"user {user!r}"] if user is not None else []) + (
        [f"group {group!r}"] if group is not None else []
    )
    return " and ".join(parts)
