"""The house rules import-linter cannot see: no module reaches into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import allocator

PACKAGE = Path(allocator.__file__).parent


def private_uses(source: str) -> list[str]:
    """``from allocator.x import _name`` and ``module._name`` of an imported allocator module."""
    tree = ast.parse(source)
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("allocator"):
            for alias in node.names:
                if _is_private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.startswith("allocator")
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_checker_sees_both_forms() -> None:
    source = (
        "from allocator.store import local\n"
        "from allocator.store.base import _secret\n"
        "local._rule()\n"
    )
    assert private_uses(source) == [
        "line 2: from allocator.store.base import _secret",
        "line 3: local._rule",
    ]


def test_no_module_uses_another_modules_private_names() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := private_uses(path.read_text()))
    }
    assert offenders == {}
