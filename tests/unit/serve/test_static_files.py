"""The status page's static files: every one ships in the package and is served, none other."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path, PurePosixPath

from allocator.serve.static_files import static_files

REPO = Path(__file__).parents[3]
STATIC = REPO / "allocator" / "serve" / "static"


def test_every_static_file_is_package_data() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["allocator"]
    for path in STATIC.rglob("*"):
        if path.is_file():
            inside = PurePosixPath(path.relative_to(REPO / "allocator").as_posix())
            # setuptools' globs: a "*" never crosses a "/"
            shipped = any(
                len(inside.parts) == len(PurePosixPath(g).parts) and inside.match(g) for g in globs
            )
            assert shipped, f"{inside} is not in pyproject's package-data: a wheel would lack it"


def test_the_page_scripts_and_uplot_are_served_and_the_rest_is_not() -> None:
    files = static_files()
    page = (STATIC / "index.html").read_text()
    for referenced in re.findall(r'(?:src|href)="/static/([^"]+)"', page):
        assert referenced in files, referenced
    assert "vendor/uplot/uPlot.iife.min.js" in files and "vendor/uplot/uPlot.min.css" in files
    assert not {"index.html", "vendor/uplot/LICENSE", "vendor/uplot/README.md"} & files.keys()
    css = files["vendor/uplot/uPlot.min.css"]
    assert css.media_type.startswith("text/css") and css.cache_control == "public, max-age=86400"
    assert files["page.js"].cache_control == "no-cache"


def test_the_vendored_uplot_is_the_one_its_readme_names() -> None:
    readme = (STATIC / "vendor" / "uplot" / "README.md").read_text()
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "LICENSE"):
        digest = hashlib.sha256((STATIC / "vendor" / "uplot" / name).read_bytes()).hexdigest()
        assert f"| {name} | {digest} |" in readme
    assert "MIT License" in (STATIC / "vendor" / "uplot" / "LICENSE").read_text()
