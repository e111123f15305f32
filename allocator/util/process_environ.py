"""The environment variables of this host's processes, read from ``/proc``.

Both ends of a holding look for the processes that carry its identity: the
agent, to stop what is left of a holding that ended; ``run`` and
``lease()``, to wait until nothing of an ended holding still runs on the
GPUs they were given. One scan serves both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["variables_of_processes"]


def variables_of_processes(
    names: tuple[str, ...], proc: Path = Path("/proc")
) -> Iterator[tuple[int, dict[str, bytes]]]:
    """Each live process but this one, with those of ``names`` its environment sets.

    Processes that set none of them are skipped. Another user's process
    needs root to read, and a vanished one is gone anyway: both are skipped.
    A zombie's environment reads empty, so it sets none of them.
    """
    wanted = {f"{name}=".encode(): name for name in names}
    own = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            variables = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found: dict[str, bytes] = {}
        for variable in variables:
            for prefix, name in wanted.items():
                if name not in found and variable.startswith(prefix):
                    found[name] = variable[len(prefix) :]
        if found:
            yield int(entry.name), found
