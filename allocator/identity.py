"""Who is acting, on which host, and what time it is (the I/O edge for both)."""

from __future__ import annotations

import getpass
import socket
from datetime import UTC, datetime

__all__ = ["actor", "format_time", "local_hostname", "parse_time", "utc_now"]


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
    return socket.gethostname().split(".")[0]


def actor() -> str:
    """``user@host`` for the audit fields of every write."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{local_hostname()}"
