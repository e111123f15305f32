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

from allocator.text import printable

__all__ = ["emit", "render_table"]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, header first; cells escaped."""
    table = [list(headers), *[[printable(str(cell)) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table
    ]
    return "\n".join(lines)


def emit(data: Any, fmt: str, text: str | None = None, *, keep: str = "\n") -> None:
    """Print ``data`` as JSON or YAML, or ``text`` for the table format.

    ``text`` is printed with control characters escaped, but for those in
    ``keep`` (line breaks; ``"\\n\\t"`` for a document shown as written).
    """
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif fmt == "yaml":
        from allocator.policy.document import dump_yaml

        sys.stdout.write(dump_yaml(data))
    elif text is not None:
        shown = printable(text, keep)
        sys.stdout.write(shown + ("\n" if shown and not shown.endswith("\n") else ""))
