"""A real full disk for a test: a small tmpfs mounted for the test, then filled (root only)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fill", "small_tmpfs"]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[str]:
    """A tmpfs of ``size`` (``256k``) at ``path`` for the block, unmounted after it.

    Yields "" once mounted, else why not (``path`` is then a plain directory).
    """
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    why_not = "" if done.returncode == 0 else done.stderr.decode().strip() or "mount failed"
    try:
        yield why_not
    finally:
        if not why_not:
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` until it says ENOSPC; return the filler."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler
