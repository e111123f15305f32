"""Each vendor's device library is imported in its own folder and nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import allocator

PACKAGE = Path(allocator.__file__).parent
#: A device library, and the vendor folder that alone may import it.
LIBRARIES = {"pynvml": "gpus/vendors/nvidia", "amdsmi": "gpus/vendors/amd"}


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_a_vendor_s_library_is_imported_only_in_its_folder() -> None:
    misplaced = [
        f"{path.relative_to(PACKAGE)} imports {library}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for library, folder in LIBRARIES.items()
        if library in imported_modules(path)
        and not path.relative_to(PACKAGE).as_posix().startswith(folder + "/")
    ]
    assert misplaced == []


def test_every_vendor_has_its_folder() -> None:
    from allocator.gpus.vendors.base import VENDOR_NAMES

    folders = {p.name for p in (PACKAGE / "gpus" / "vendors").iterdir() if p.is_dir()}
    assert set(VENDOR_NAMES) <= folders
