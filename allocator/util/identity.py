"""Who is acting and on which host: the operating system's answers (the I/O edge).

The audit fields (``updated_by``, ``applied_by``) name who wrote a record.
They come from the operating system (the process's real user id, looked up
in the password database) and from the store's authenticated user where the
store has one (etcd), never from ``$LOGNAME``/``$USER``: anyone can set those
to anything, newlines and terminal escapes included.

This machine is the host ``run`` and ``lease()`` take GPUs on: the command
runs here, so another host's GPU numbers would mean nothing. It goes by its
host name (short or full), or by ``$ALLOCATOR_HOST`` where the policy names
it otherwise (a container, a test's made-up fleet).
"""

from __future__ import annotations

import os

from allocator.errors import InvalidInput
from allocator.util.printable import printable

__all__ = [
    "HOST_VARIABLE",
    "check_this_host",
    "clean_name",
    "local_hostname",
    "os_user",
    "this_host",
]

#: The variable that names this machine as the policy does (also set for every worker).
HOST_VARIABLE = "ALLOCATOR_HOST"

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


def this_host() -> str:
    """The name this machine goes by in the policy: ``$ALLOCATOR_HOST``, else its short name."""
    return os.environ.get(HOST_VARIABLE) or local_hostname()


def check_this_host(host: str) -> None:
    """``InvalidInput`` (one line) unless ``host`` names this machine.

    Its names: ``$ALLOCATOR_HOST``, and the host name, short and as the
    system gives it (maybe fully qualified). No DNS is asked.
    """
    full = os.uname().nodename if hasattr(os, "uname") else local_hostname()
    names = {os.environ.get(HOST_VARIABLE), full, full.split(".")[0]}
    if not host or host not in names:
        raise InvalidInput(
            f"host={host} is not this machine (this is {this_host()}; set "
            f"{HOST_VARIABLE}={host} if the policy names this machine {host})"
        )


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
