"""docs/agent.md's systemd steps, followed as written on a fresh host, give a unit systemd takes.

The steps run under a scratch root (every ``/etc/`` and ``/opt/`` path moved below it), as
root would run them on a host where neither ``/etc/allocator`` nor the agent exists yet. Two
lines are not run: ``systemctl`` (no systemd manages this test), and the ``pip install``,
which needs the package index; in its place the ``allocator`` command this test runs under is
linked where that pip would put it. ``systemd-analyze verify`` then checks the unit the steps
installed, its ``ExecStart`` program included.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "agent.md"


def _systemd_steps() -> list[str]:
    """The command lines of the first sh block under the manual's systemd paragraph."""
    section = DOC.read_text().split("**systemd.**", 1)[1]
    block = re.search(r"^```sh\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert block is not None, "docs/agent.md has no systemd commands"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _moved(text: str, root: Path) -> str:
    return text.replace("/etc/", f"{root}/etc/").replace("/opt/", f"{root}/opt/")


def _install_entry_point(line: str, root: Path) -> None:
    """Stand in for the docs' ``<venv>/bin/pip install ...``: the same command, in that venv."""
    pip = Path(_moved(shlex.split(line)[0], root))
    assert pip.name == "pip" and pip.parent.is_dir(), f"pip of a venv made above: {line}"
    (pip.parent / "allocator").symlink_to(Path(sys.executable).parent / "allocator")


def test_the_systemd_steps_install_a_unit_systemd_accepts(tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    assert verify is not None, "systemd-analyze is missing: run tools/install-test-servers"
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)  # there on any systemd host
    steps = _systemd_steps()
    assert any(" -m venv " in line for line in steps), "the steps make a venv for allocator"
    for line in steps:
        if line.startswith("systemctl "):
            continue
        if re.match(r"\S+/bin/pip install ", line):
            _install_entry_point(line, root)
            continue
        ran = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", _moved(line, root)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 0, f"{line}: {ran.stderr}"
    installed = root / "etc" / "systemd" / "system" / "allocator-agent.service"
    unit = tmp_path / "allocator-agent.service"
    unit.write_text(_moved(installed.read_text(), root))
    result = subprocess.run(
        [verify, "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (root / "etc" / "allocator" / "agent.yaml").is_file()
