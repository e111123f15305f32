"""Stored text made safe to print: control characters escaped.

Anything in the store may have been written by hand (``etcdctl put``) or by
an older version, so a reason, an audit name or a policy may hold a newline
that forges a line of output, or a terminal escape sequence that rewrites
the next operator's screen. Everything printed from the store goes through
:func:`printable` first.
"""

from __future__ import annotations

__all__ = ["one_line", "printable"]


def printable(text: str, keep: str = "") -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\u2028``).

    Characters in ``keep`` (``"\\n\\t"`` for a document printed as it is) are
    left alone.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def one_line(message: str) -> str:
    """Collapse whitespace and escape control characters a user may have typed.

    An error message often quotes the input; a typed ``\x1e`` or newline must
    not split the one line a script reads from stderr.
    """
    return printable(" ".join(message.split()))
