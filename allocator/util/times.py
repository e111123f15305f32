"""Times as records store them: RFC 3339 in UTC with a ``Z``, to the second.

The one place a moment becomes text and back. A naive ``datetime`` (one
without a time zone) is read as UTC everywhere, never as local time: the
policy's reservation times and every stored time are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["format_time", "parse_time", "utc_now"]


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, second precision: what records store (naive = UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime | None:
    """Parse a stored :func:`format_time` value; ``None`` if empty or malformed."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
