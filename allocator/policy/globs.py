"""What a reservation's job glob can match, judged against the job-name grammar.

A glob is matched with :func:`fnmatch.fnmatchcase` against job names, which
are 1-63 characters of ``[A-Za-z0-9._-]``, never ``.`` or ``..``, never
starting with ``-`` (:func:`allocator.records.keys.validate_name`). A glob that no
such name can match reserves GPUs for nobody; one that every name matches
excludes nobody. Both are mistakes this module detects exactly, by reading
the glob the way ``fnmatch`` does, one position at a time.
"""

from __future__ import annotations

import fnmatch
import string
from typing import Final

from allocator.records.keys import MAX_NAME_LENGTH

__all__ = ["NAME_CHARACTERS", "glob_matches_every_name", "glob_never_matches"]

#: The characters a job name may contain.
NAME_CHARACTERS: Final = frozenset(string.ascii_letters + string.digits + "._-")

# A token is the set of name characters one position may hold; None is ``*``.
Token = frozenset[str] | None


def _tokens(pattern: str) -> list[Token]:
    """Split ``pattern`` as :func:`fnmatch.translate` does: ``*``, ``?``, ``[set]``, literals."""
    tokens: list[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        i += 1
        if char == "*":
            if not tokens or tokens[-1] is not None:  # ** is *
                tokens.append(None)
        elif char == "?":
            tokens.append(NAME_CHARACTERS)
        elif char == "[":
            end = _set_end(pattern, i)
            if end is None:
                tokens.append(frozenset("[") & NAME_CHARACTERS)  # an unclosed [ is literal
            else:
                members = "[" + pattern[i:end] + "]"
                tokens.append(_matching(members))
                i = end + 1
        else:
            tokens.append(frozenset(char) & NAME_CHARACTERS)
    return tokens


def _matching(members: str) -> frozenset[str]:
    """The name characters a ``[...]`` set matches."""
    return frozenset(c for c in NAME_CHARACTERS if fnmatch.fnmatchcase(c, members))


def _set_end(pattern: str, start: int) -> int | None:
    """Index of the ``]`` closing a set opened just before ``start``, or ``None``."""
    j = start
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    return j if j < len(pattern) else None


def glob_never_matches(pattern: str) -> str | None:
    """Why no valid job name can match ``pattern``, or ``None`` if some can."""
    tokens = _tokens(pattern)
    fixed = [token for token in tokens if token is not None]
    for token in fixed:
        if not token:
            return "one of its positions can hold no character a job name may contain"
    if len(fixed) > MAX_NAME_LENGTH:
        return f"it needs {len(fixed)} characters or more; names have at most {MAX_NAME_LENGTH}"
    first = tokens[0] if tokens else None
    if first is not None and first <= {"-"}:
        return "job names never start with '-'"
    if None not in tokens and all(token <= {"."} for token in fixed) and len(fixed) <= 2:
        return "'.' and '..' are not job names"
    return None


def glob_matches_every_name(pattern: str) -> bool:
    """Whether every valid job name matches ``pattern`` (``*``, ``?*``, ``*[!/]*``)."""
    tokens = _tokens(pattern)
    fixed = [token for token in tokens if token is not None]
    return None in tokens and len(fixed) <= 1 and all(t == NAME_CHARACTERS for t in fixed)
