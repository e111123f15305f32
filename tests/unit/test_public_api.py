"""Every module says what it exports (``__all__``), and every export is real and documented."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import allocator

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(allocator.__path__, "allocator.")
    if info.name != "allocator.__main__"  # running it starts the CLI
)


@pytest.mark.parametrize("name", MODULES)
def test_exports_exist_and_are_documented(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} does not declare __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names {symbol!r}, which does not exist"
        value = getattr(module, symbol)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name}.{symbol} has no docstring"
