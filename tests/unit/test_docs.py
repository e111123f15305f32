"""The README's tour runs and its links lead somewhere, the manual lists every page, and install
lines name our distribution (the name ``allocator`` on PyPI is another project)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
#: Markdown links and images: [text](target) with no scheme.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    targets = _LINK.findall((REPO / "README.md").read_text())
    local = [t for t in targets if "://" not in t and not t.startswith("#")]
    assert local, "the README links into the manual"
    for target in local:
        assert (REPO / target.split("#")[0]).exists(), target


def test_the_manual_lists_every_page_and_the_readme_links_each() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["docs_dir"] == "docs"
    pages = _nav_pages(config["nav"])
    assert sorted(pages) == sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    readme = (REPO / "README.md").read_text()
    for page in pages:
        if page != "index.md":
            assert f"(docs/{page})" in readme, page


def test_install_lines_name_the_distribution() -> None:
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "gpu-allocator"
    texts = [REPO / "README.md", REPO / "Dockerfile", *DOCS.glob("*.md")]
    texts += [p for p in (REPO / "allocator").rglob("*.py")]
    for path in texts:
        for line in path.read_text().splitlines():
            if "pip install" in line:
                assert "'allocator[" not in line and '"allocator[' not in line, (path, line)


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    """Every line of the tour but the agent (which runs until stopped), on a fresh store."""
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A ten-line tour", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [
        line
        for line in tour.splitlines()
        if line.startswith(("allocator ", "eval ")) and not line.startswith("allocator agent")
    ]
    assert len(lines) >= 8
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ALLOCATOR_STORE": f"sqlite://{tmp_path / 'store.db'}",
        "ALLOCATOR_NVML": "off",
        "ALLOCATOR_HOST": "node1",  # the tour's `run` runs on node1, as its comment says
    }
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", "\n".join(lines)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "released train@node1" in result.stdout


def test_the_manual_s_home_page_is_the_readme_built_strictly(tmp_path: Path) -> None:
    """docs/index.md is the README at build time, never a copy of it left to go stale."""
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    home = (site / "index.html").read_text()
    readme = (REPO / "README.md").read_text()
    for line in ("Researchers take GPUs for their own commands", "The wait queue and quotas"):
        assert line in readme and line in home, line
    assert 'href="queue/"' in home  # the README's docs/queue.md, as the site names it
    assert "config-driven GPU allocator" not in (DOCS / "index.md").read_text()  # no copy


def test_the_development_page_names_what_the_tree_has() -> None:
    """Every make target, file and test folder docs/development.md names exists, and every
    package tools/install-test-servers installs is named there."""
    page = (DOCS / "development.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", page, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), f"make {target}"
    for path in re.findall(r"`((?:tests|tools|allocator|config)/[\w./<>-]+)`", page):
        if "<" not in path:
            assert (REPO / path).exists(), path
    installer = (REPO / "tools" / "install-test-servers").read_text()
    for package in re.findall(r"need\+=\(([\w-]+)\)", installer):
        assert f"`{package}`" in page, package
    assert "torch's 2.13.0 CPU wheel" not in page or "whl/cpu" in makefile
    folders = {p.name for p in (REPO / "tests" / "unit").iterdir() if p.is_dir()}
    assert folders - {"support", "__pycache__"} <= {p.name for p in (REPO / "allocator").iterdir()}
