"""Durations as people write them (``90s``, ``30m``, ``2h``, ``1h30m``, ``7d``), and back.

A bare number is refused: ``2`` could be seconds, minutes or hours, and a
policy that releases GPUs after 2 seconds instead of 2 hours is a bad day.
"""

from __future__ import annotations

import math
import re

__all__ = ["DURATION_PATTERN", "duration_text", "format_duration", "parse_duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = r"(\d+(?:\.\d+)?)([smhd])"
#: What a duration looks like (JSON Schema / ECMA-262 compatible).
DURATION_PATTERN = r"^(\d+(\.\d+)?[smhd])+$"
_WHOLE = re.compile(rf"(?:{_PART})+", re.ASCII)
_PARTS = re.compile(_PART, re.ASCII)


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``90s``, ``30m``, ``2h``, ``1h30m``, ``7d``); ``ValueError`` if none.

    Units are s, m, h and d, largest first, each at most once.
    """
    cleaned = text.strip()
    if not _WHOLE.fullmatch(cleaned):
        hint = " (add a unit: s, m, h or d)" if _is_number(cleaned) else ""
        raise ValueError(f"{text!r} is not a duration like 90s, 30m, 2h, 1h30m or 7d{hint}")
    parts = _PARTS.findall(cleaned)
    units = [unit for _, unit in parts]
    order = list(_UNITS)
    if len(set(units)) != len(units) or units != sorted(units, key=order.index, reverse=True):
        raise ValueError(f"{text!r}: give each unit once, largest first (like 1h30m)")
    seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def format_duration(seconds: float) -> str:
    """A short human form: ``45s``, ``12m05s``, ``2h03m``, ``3d04h`` (seconds rounded down)."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def duration_text(seconds: float) -> str:
    """``seconds`` exactly, as :func:`parse_duration` reads it (``2h``, ``1h30m``, ``1.5s``)."""
    if seconds <= 0:
        return "0s"
    whole = int(seconds)
    parts = []
    rest = whole
    for unit in ("d", "h", "m"):
        count, rest = divmod(rest, int(_UNITS[unit]))
        if count:
            parts.append(f"{count}{unit}")
    fraction = seconds - whole
    if rest or fraction or not parts:
        parts.append(f"{rest + fraction:g}s")
    return "".join(parts)
