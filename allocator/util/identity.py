"""Who is acting and on which host: the operating system's answers (the I/O edge).

The audit fields (``updated_by``, ``applied_by``) name who wrote a record.
They come from the operating system (the process's real user id, looked up
in the password database) and from the store's authenticated user where the
store has one (etcd), never from ``$LOGNAME``/``$USER``: anyone can set those
to anything, newlines and terminal escapes included.
"""

from __future__ import annotations

import os

from allocator.util.printable import printable

__all__ = ["clean_name", "local_hostname", "os_user"]

#: Longest user or host name kept in an audit field (the record allows 4,096 characters).
_MAX_NAME = 64


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
    return clean_name(name) or f"uid {number}"


def clean_name(name: str) -> str:
    """A name fit for an audit field: control characters escaped, length bounded."""
    return printable(name)[:_MAX_NAME]
