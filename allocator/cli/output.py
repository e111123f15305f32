"""Rendering for people (aligned tables) and for scripts (JSON, YAML).

Whatever is printed may come from the store, where anyone with write access
(or an older version) can have left control characters: a newline that
forges a table row, an escape sequence that rewrites the next operator's
terminal. Table cells and text are printed with them escaped; JSON and YAML
escape them by their own rules.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from allocator.util.printable import printable

__all__ = ["emit", "json_text", "render_table"]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, header first; cells escaped."""
    table = [list(headers), *[[printable(str(cell)) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table
    ]
    return "\n".join(lines)


def json_text(data: Any) -> str:
    """``data`` as JSON, keys sorted, indented by two, ASCII only, with a final newline.

    msgspec writes it (a fleet's status is megabytes: ``json.dumps`` with an
    indent runs its pure-Python encoder, 20x slower). msgspec writes text as
    UTF-8; a document holding anything past ASCII (or DEL) is written by
    ``json`` instead, so every character a terminal could act on stays a
    ``\\u`` escape, as it always was.
    """
    import msgspec

    try:
        encoded: bytes | None = msgspec.json.format(
            msgspec.json.encode(data, order="sorted"), indent=2
        )
    except (TypeError, msgspec.EncodeError):  # keys only json takes (True: "true")
        encoded = None
    if encoded is not None and encoded.isascii() and b"\x7f" not in encoded:
        return encoded.decode("ascii") + "\n"
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def emit(data: Any, fmt: str, text: str | None = None, *, keep: str = "\n") -> None:
    """Print ``data`` as JSON or YAML, or ``text`` for the table format.

    ``text`` is printed with control characters escaped, but for those in
    ``keep`` (line breaks; ``"\\n\\t"`` for a document shown as written).
    """
    if fmt == "json":
        sys.stdout.write(json_text(data))
    elif fmt == "yaml":
        from allocator.policy.yamlspec.document import dump_yaml

        sys.stdout.write(dump_yaml(data))
    elif text is not None:
        shown = printable(text, keep)
        sys.stdout.write(shown + ("\n" if shown and not shown.endswith("\n") else ""))
