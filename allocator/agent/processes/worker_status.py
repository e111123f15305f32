"""A worker's status file: written first by the agent, then by the worker's shim.

The agent writes it before it starts the shim (``prepared``): where it
cannot be written (a full disk), neither can the shim's, and the worker does
not start. The shim then rewrites it as the worker starts, runs and ends,
which is how an agent restarted after ``kill -9`` learns how a worker that
is not its child ended, and adopts one still running from this file alone.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from allocator.agent.kernel import procs
from allocator.agent.planning.types import DesiredJob
from allocator.agent.processes.job_state import WorkerRuntime

__all__ = ["ShimStatus", "read_shim_status", "record_status", "status_fields", "status_signature"]


class ShimStatus(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The shim's status file: who it is, the worker's main process, how it ended.

    The agent writes it first (``prepared``, ``shim_pid`` 0) to know it can
    before it starts the shim; the fields from ``job`` on are the agent's
    (see :func:`status_fields`), which let a later agent adopt the worker
    from this file alone, and only on the boot that wrote it.
    """

    shim_pid: int
    state: str  # prepared, starting, running, exited, failed
    shim_start_ticks: int | None = None
    pid: int = 0
    start_ticks: int | None = None
    exit_code: int | None = None
    error: str = ""
    job: str = ""
    index: str = ""
    fingerprint: str = ""
    gpus: str = ""
    device: str = ""
    grace: str = ""
    cgroup: str = ""
    boot_id: str = ""
    container: str = ""  # the worker's container, when it runs in one
    engine: str = ""  # and the engine's path
    revision: str = ""  # of the assignment the worker was started under


def status_fields(job: DesiredJob, worker: WorkerRuntime, boot_id: str) -> dict[str, str]:
    """The agent's fields of a worker's status file (all text: the shim writes them as is)."""
    return {
        "job": job.job,
        "index": str(worker.spec.index),
        "fingerprint": job.fingerprint,
        "gpus": ",".join(map(str, job.gpus)),
        "device": job.device,
        "grace": repr(float(job.grace_seconds)),
        "cgroup": worker.cgroup,
        "boot_id": boot_id,
        "revision": str(job.assignment_revision),
    }


def record_status(path: Path, fields: dict[str, str]) -> str:
    """Write the worker's first status file (``prepared``); "" if done, else why not.

    Written by the agent before the shim exists: where it cannot be written
    (a full disk), neither can the shim's, and the worker must not start.
    """
    try:
        procs.write_json_atomic(path, {"shim_pid": 0, "state": "prepared", **fields}, durable=False)
    except OSError as exc:
        return f"cannot write the worker's status file {path}: {exc.strerror or exc}"
    return ""


def read_shim_status(path: Path) -> ShimStatus | None:
    """The status file's content; None when it is missing or not a status (never raises)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=ShimStatus)
    except (OSError, msgspec.DecodeError):
        return None


def status_signature(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of the status file: it changes whenever the shim rewrites it."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns
