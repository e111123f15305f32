"""Who is acting, on which host, and what time it is (the I/O edge for both).

The audit fields (``updated_by``, ``applied_by``) name who wrote a record.
They come from the operating system (the process's real user id, looked up
in the password database) and from the store's authenticated user where the
store has one (etcd), never from ``$LOGNAME``/``$USER``: anyone can set those
to anything, newlines and terminal escapes included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime

from allocator.util.printable import printable

__all__ = [
    "actor",
    "format_time",
    "local_hostname",
    "os_user",
    "parse_time",
    "store_user",
    "utc_now",
]

#: Longest user or host name kept in an audit field (the record allows 4,096 characters).
_MAX_NAME = 64


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, second precision: what records store."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | None:
    """Parse a stored :func:`format_time` value; ``None`` if empty or malformed."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def local_hostname() -> str:
    """This machine's short host name."""
    # What gethostname(2) returns, without importing socket (a one-shot command's
    # milliseconds) where the platform has uname.
    if hasattr(os, "uname"):
        return os.uname().nodename.split(".")[0]
    import socket

    return socket.gethostname().split(".")[0]


def os_user(uid: int | None = None) -> str:
    """The login name of ``uid`` (default: this process's real user), or ``uid N``."""
    import pwd

    number = os.getuid() if uid is None else uid
    try:
        name = pwd.getpwuid(number).pw_name
    except KeyError:  # a container user with no password entry
        return f"uid {number}"
    return _clean(name) or f"uid {number}"


def store_user(url: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The user the store authenticates the client as, where the URL's store has one.

    etcd: the user in the URL or ``ETCDCTL_USER``. Consul ACL tokens carry no
    user name and SQLite has no users: ``None``.
    """
    if url is None or not url.startswith(("etcd://", "etcds://")):
        return None
    from allocator.errors import StoreConfigError
    from allocator.store.etcd.config import parse_etcd_url

    try:
        name = parse_etcd_url(url, os.environ if env is None else env).username
    except StoreConfigError:
        return None
    return _clean(name) if name else None


def actor(store_url: str | None = None) -> str:
    """``user@host`` for the audit fields of every write, plus the store's user if any.

    ``alice@node1``, or ``alice@node1 (etcd user ops)`` when the store
    authenticated the client as ``ops``.
    """
    who = f"{os_user()}@{_clean(local_hostname()) or 'unknown'}"
    authenticated = store_user(store_url)
    return f"{who} (etcd user {authenticated})" if authenticated else who


def _clean(name: str) -> str:
    """A name fit for an audit field: control characters escaped, length bounded."""
    return printable(name)[:_MAX_NAME]
