"""Rendering for people (aligned tables) and for scripts (JSON, YAML)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["emit", "render_table"]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, header first."""
    table = [list(headers), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table
    ]
    return "\n".join(lines)


def emit(data: Any, fmt: str, text: str | None = None) -> None:
    """Print ``data`` as JSON or YAML, or ``text`` for the table format."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=True, default_flow_style=False))
    elif text is not None:
        sys.stdout.write(text + ("\n" if text and not text.endswith("\n") else ""))
