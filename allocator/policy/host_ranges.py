"""Host range patterns: ``node[0000-12499]`` names 12,500 hosts in one policy key.

A pattern is a host name with one or more bracketed lists of numbers or
number ranges: ``gpu-[1-8]``, ``node[01-04,10]``, ``rack[1-2]-n[01-16]``
(several brackets: every combination, the last bracket varying fastest).
A number written with leading zeros pads every number of its range to its
width, as written: ``node[0000-12499]`` is ``node0000`` .. ``node9999``,
``node10000`` .. ``node12499`` (Slurm's hostlist rule).

The count is computed before any name is made, so a hostile
``n[0-999999999]`` costs nothing but its error.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from allocator.errors import InvalidName
from allocator.records.keys import validate_name

__all__ = ["HOST_PATTERN_SCHEMA", "expand_hosts", "is_host_pattern", "pattern_count"]

_NAME_PART = r"[A-Za-z0-9._-]"
_SPAN = r"[0-9]+(?:-[0-9]+)?"
_BRACKET = rf"\[{_SPAN}(?:,{_SPAN})*\]"
#: JSON Schema (ECMA-262) of a host key: a name, or a name with bracketed ranges.
HOST_PATTERN_SCHEMA = rf"^(?!\.\.?$)(?!-)(?:{_NAME_PART}|{_BRACKET})+$"
_PIECES = re.compile(rf"({_BRACKET})", re.ASCII)
_DIGITS_LIMIT = 9  # a number of more digits is a typo, and would make huge counts


def is_host_pattern(key: str) -> bool:
    """Whether ``key`` is written as a range pattern (it holds a bracket)."""
    return "[" in key or "]" in key


def _spans(bracket: str) -> list[tuple[int, int, int]]:
    """``(first, last, width)`` of each span of one ``[...]``; ``ValueError`` when unusable."""
    spans = []
    for part in bracket[1:-1].split(","):
        low, _, high = part.partition("-")
        high = high or low
        if len(low) > _DIGITS_LIMIT or len(high) > _DIGITS_LIMIT:
            raise ValueError(f"[{part}] has a number of more than {_DIGITS_LIMIT} digits")
        first, last = int(low), int(high)
        if last < first:
            raise ValueError(f"[{part}] runs backwards ({high} < {low})")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        spans.append((first, last, width))
    return spans


def _parse(key: str) -> list[str | list[tuple[int, int, int]]]:
    """The pattern as fixed text and bracket spans; ``ValueError`` saying why it is not one."""
    pieces: list[str | list[tuple[int, int, int]]] = []
    for index, piece in enumerate(_PIECES.split(key)):
        if index % 2:
            pieces.append(_spans(piece))
        elif "[" in piece or "]" in piece:
            raise ValueError(
                f"host pattern {key!r}: brackets hold numbers and ranges "
                "(node[0000-12499], gpu-[1-8], n[1-4,7])"
            )
        elif piece:
            pieces.append(piece)
    return pieces


def pattern_count(key: str) -> int:
    """How many host names ``key`` stands for (1 for a plain name); ``ValueError`` if unusable."""
    if not is_host_pattern(key):
        return 1
    total = 1
    for piece in _parse(key):
        if isinstance(piece, list):
            total *= sum(last - first + 1 for first, last, _ in piece)
    return total


def _choices(piece: str | list[tuple[int, int, int]]) -> list[str]:
    if isinstance(piece, str):
        return [piece]
    return [
        str(number).zfill(width)
        for first, last, width in piece
        for number in range(first, last + 1)
    ]


def expand_hosts(key: str, limit: int) -> list[str]:
    """Every host name ``key`` stands for, in order, each checked as a host name.

    ``ValueError`` when ``key`` is no usable pattern, stands for more than
    ``limit`` hosts, or makes a name no host may have (the first such name
    is in the message).
    """
    count = pattern_count(key)
    if count > limit:
        raise ValueError(f"host pattern {key!r} names {count:,} hosts; at most {limit:,}")
    names = list(_names(key)) if is_host_pattern(key) else [key]
    if len(set(names)) != len(names):
        raise ValueError(f"host pattern {key!r} names some hosts twice")
    # every name has the same characters, in the same places: only the first
    # (for '.', '..', a leading '-') and the longest (for the length) can fail
    for name in (names[0], max(names, key=len)):
        try:
            validate_name(name, "host name")
        except InvalidName as exc:
            raise ValueError(f"host pattern {key!r} makes {name!r}: {exc}") from None
    return names


def _names(key: str) -> Iterator[str]:
    pieces = [_choices(piece) for piece in _parse(key)]
    return ("".join(parts) for parts in itertools.product(*pieces))
