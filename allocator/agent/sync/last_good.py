"""The assignments the agent last read intact, kept on local disk.

While a job's record in the store is damaged the agent keeps running it as
its last good assignment said (a bad record is never a reason to stop a
worker). An agent restarted while the record is still damaged has read no
good version of it yet; this file gives it the one its predecessor had, so
the adopted worker keeps running instead of being stopped as unassigned.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from allocator.agent.kernel.procs import write_json_atomic
from allocator.errors import BadRecord
from allocator.records.codec import decode_record
from allocator.records.types import Assignment

__all__ = ["load_last_good", "save_last_good"]

_VERSION = 1


def load_last_good(path: Path, host: str) -> tuple[dict[str, Assignment], dict[str, int]]:
    """The saved assignments and their revisions ({} when absent or unreadable).

    Each entry is decoded as strictly as a store record: the file is a cache,
    and a damaged one is simply not used.
    """
    try:
        data = json.loads(path.read_text())
        entries = data["jobs"] if data.get("version") == _VERSION else {}
        assignments: dict[str, Assignment] = {}
        revisions: dict[str, int] = {}
        for job, entry in entries.items():
            raw = json.dumps(entry["assignment"]).encode()
            assignments[job] = decode_record(raw, Assignment, str(path), job=job, host=host)
            revisions[job] = int(entry["revision"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError, BadRecord):
        return {}, {}
    return assignments, revisions


def save_last_good(
    path: Path, assignments: Mapping[str, Assignment], revisions: Mapping[str, int]
) -> None:
    """Rewrite the file with ``assignments`` (OSError if the state directory is unusable)."""
    jobs = {
        job: {"assignment": json.loads(a.to_json()), "revision": revisions.get(job, 0)}
        for job, a in sorted(assignments.items())
    }
    write_json_atomic(path, {"version": _VERSION, "jobs": jobs})
