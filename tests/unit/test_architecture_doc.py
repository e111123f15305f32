"""docs/architecture.md is the tree's table of contents: every package and every flow is named."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"


def _packages() -> list[str]:
    root = REPO / "allocator"
    return sorted(
        str(init.parent.relative_to(root))
        for init in root.rglob("__init__.py")
        if init.parent != root and "__pycache__" not in init.parts
    )


def test_every_package_is_named_by_its_path() -> None:
    """A package the page never names fails here, naming it: `agent/sync/`, `recipes/queue/`."""
    page = PAGE.read_text()
    missing = [p for p in _packages() if f"`{p}/`" not in page]
    assert not missing, f"docs/architecture.md names no {', '.join(missing)}"


def test_every_module_is_named_in_its_package() -> None:
    """Each module's file name appears on the page (`sync/store_thread.py` or `store_thread.py`)."""
    page = PAGE.read_text()
    root = REPO / "allocator"
    missing = [
        str(m.relative_to(root))
        for m in sorted(root.rglob("*.py"))
        if m.name != "__init__.py"
        and "__pycache__" not in m.parts
        and f"{m.name}`" not in page
        and f"`{m.stem}`" not in page
    ]
    assert not missing, f"docs/architecture.md names no {', '.join(missing)}"


def test_the_flows_of_set_the_agent_run_and_the_queue_are_followed() -> None:
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    for flow in ("allocator set", "watch event", "allocator run", "queue"):
        assert any(flow in h for h in headings), f"no section follows {flow!r}: {headings}"
