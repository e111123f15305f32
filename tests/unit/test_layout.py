"""Unit tests mirror the package: ``tests/unit/<path>/test_<module>[_<behaviour>].py``.

The tests of ``allocator/<path>/<module>.py`` live in ``tests/unit/<path>/``
and are named after the module (or a sub-package) they test; a behaviour that
needs a file of its own adds its name after the module's. Files directly in
``tests/unit/`` test what spans folders; ``tests/unit/support/`` tests the
test helpers.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "tests" / "unit"
PACKAGE = REPO / "allocator"


def _names(package: Path) -> set[str]:
    # A package's own ``__init__.py`` (the CLI's entry, the store's opener) is ``init``.
    modules = {m.stem.strip("_") for m in package.glob("*.py")}
    return modules | {d.name for d in package.iterdir() if (d / "__init__.py").exists()}


def _strays() -> list[str]:
    strays = []
    for test in sorted(UNIT.rglob("test_*.py")):
        folder = test.parent.relative_to(UNIT)
        if folder == Path(".") or folder.parts[0] == "support":
            continue
        package = PACKAGE / folder
        names = _names(package) if package.is_dir() else set()
        subject = test.stem.removeprefix("test_")
        if not any(subject == n or subject.startswith(f"{n}_") for n in names):
            strays.append(str(test.relative_to(REPO)))
    return strays


def test_every_unit_test_file_is_named_after_a_module_of_its_mirrored_package() -> None:
    strays = _strays()
    assert not strays, f"no module of the mirrored package is named by: {', '.join(strays)}"


def test_every_unit_test_folder_mirrors_a_package() -> None:
    folders = [
        str(d.relative_to(UNIT))
        for d in UNIT.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and d.relative_to(UNIT).parts[0] != "support"
    ]
    missing = [f for f in folders if not (PACKAGE / f / "__init__.py").exists()]
    assert not missing, f"tests/unit folders with no package: {', '.join(missing)}"
