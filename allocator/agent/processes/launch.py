"""Starting a worker under its shim, which reports through the worker's status file.

Each worker runs as ``python -I -S shim/main.py ... -- ARGV`` in a session of its
own (see :mod:`allocator.agent.shim.main`): the shim is the anchor of the
worker's process tree and writes the worker's exit status to a file in the
agent's state directory (:mod:`allocator.agent.processes.worker_status`),
which is how an agent restarted after ``kill -9`` learns how a worker that
is not its child ended.

The worker's log is opened here, by the agent, without following symlinks
and only if it is a plain file with one name, and is handed to the worker's
user: a job cannot make the agent write through a link it planted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.agent.kernel import procs
from allocator.agent.kernel.cgroups import create_worker_cgroup
from allocator.agent.planning.types import DesiredJob, WorkerSpec
from allocator.agent.processes.container_launch import EngineMissing, container_launch
from allocator.agent.processes.job_state import WorkerRuntime
from allocator.agent.processes.pause_points import pause_point
from allocator.agent.processes.users import RunAs, RunAsError, identity_env, resolve_run_as
from allocator.agent.processes.warm_shim import IdleShim
from allocator.agent.processes.worker_status import status_fields
from allocator.agent.shim.main import EXIT_HANDOVER, EXIT_NO_STATUS, HANDED, NO_VALUE, frame
from allocator.gpus.topology import cpu_list

__all__ = [
    "SHIM",
    "SHIM_REFUSALS",
    "Launch",
    "LogError",
    "launch_worker",
    "log_header",
    "open_log",
    "prepare_worker",
    "reserve_log",
    "shim_env",
    "start_under_shim",
    "worker_log",
]

#: The shim program, run by path with the agent's interpreter in isolated mode.
SHIM = Path(__file__).parent.parent / "shim" / "main.py"

_EXIT_NOT_FOUND = 127
_EXIT_CANNOT_RUN = 126
_LOG_MODE = 0o640
#: The shim's exit codes for "started nothing", and why (the agent logs and shows it).
SHIM_REFUSALS = {
    EXIT_NO_STATUS: "its shim could not write its status file, so it started nothing",
    EXIT_HANDOVER: "its shim got an incomplete hand-over, so it started nothing",
}


@dataclass(frozen=True, slots=True)
class Launch:
    """A started shim (``pid`` > 0), or why the worker could not start (exit code, error)."""

    pid: int
    start_ticks: int | None
    popen: subprocess.Popen[bytes] | None
    exit_code: int | None = None
    error: str = ""


class LogError(Exception):
    """The worker's log file cannot be used safely."""


def open_log(path: Path, run_as: RunAs | None) -> int:
    """Open ``path`` for appending; the descriptor belongs to the caller.

    Refuses a symlink (``O_NOFOLLOW``), a FIFO or device (opened without
    blocking, then checked) and a file with another name (a hard link to
    something the worker's user should not write). The file is handed to
    ``run_as`` so the job's user owns its own log.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, _LOG_MODE)
    except OSError as exc:
        words = "it is a symbolic link" if path.is_symlink() else exc.strerror or str(exc)
        raise LogError(f"cannot open log {path}: {words}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise LogError(f"cannot open log {path}: not a plain file with a single name")
        os.set_blocking(fd, True)
        if run_as is not None and os.geteuid() == 0:
            os.fchown(fd, run_as.uid, run_as.gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def start_under_shim(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | None,
    log_path: Path,
    header: str,
    status_path: Path,
    grace: float,
    cgroup: Path | None,
    run_as: RunAs | None,
    cpus: Sequence[int] = (),
    warm: IdleShim | None = None,
    status: Mapping[str, str] | None = None,
    settings: Mapping[str, str] | None = None,
) -> Launch:
    """Start ``argv`` under a shim in a new session, output appended to ``log_path``.

    The environment (and the CPUs to pin the worker to, if any) is handed
    over at exec time, so it holds from the worker's first instruction.
    Nothing is raised: a log that cannot be opened or a shim that cannot
    start is a failed :class:`Launch` with a shell-like exit code (126) and
    one line saying why. A command that does
    not exist is reported by the shim (status ``failed``, exit 127).
    With ``warm`` (an idle shim, see :mod:`allocator.agent.processes.warm_shim`), that shim
    is handed the worker; one that cannot take it is replaced by a cold start.
    """
    if not argv:
        return Launch(0, None, None, _EXIT_NOT_FOUND, "empty command")
    try:
        log = open_log(log_path, run_as)
    except (LogError, OSError) as exc:
        return Launch(0, None, None, _EXIT_CANNOT_RUN, str(exc))
    try:
        if header:
            os.write(log, header.encode(errors="replace") + b"\n")
    except OSError as exc:
        os.close(log)
        return Launch(0, None, None, _EXIT_CANNOT_RUN, f"cannot write log {log_path}: {exc}")
    arguments = [
        str(status_path),
        repr(max(float(grace), 0.0)),
        str(cgroup) if cgroup is not None else NO_VALUE,
        run_as.shim_argument() if run_as is not None else NO_VALUE,
        _cwd_argument(cwd),
    ]
    payload = _env_payload(env, cpus, status or {}, settings or {})
    if warm is not None:
        handed = warm.hand_over([*arguments, HANDED, "--", *argv], payload, log)
        if handed:
            os.close(log)
            return Launch(warm.pid, warm.start_ticks, warm.popen)
    return _start_cold(arguments, argv, payload, log)


def _start_cold(arguments: list[str], argv: Sequence[str], payload: bytes, log: int) -> Launch:
    """Start a new shim for the worker (closes ``log``)."""
    env_read, env_write = os.pipe()
    try:
        command = [
            sys.executable or "python3",
            "-I",
            "-S",
            str(SHIM),
            *arguments,
            str(env_read),
            "--",
            *argv,
        ]
        popen = subprocess.Popen(
            command,
            env=shim_env(),  # the shim may be root: no job's LD_PRELOAD & co. may reach it
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            pass_fds=(env_read,),
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        message = f"cannot start the worker's shim: {exc}"
        with contextlib.suppress(OSError):
            os.write(log, f"allocator: {message}\n".encode(errors="replace"))
        os.close(env_write)
        return Launch(0, None, None, _EXIT_CANNOT_RUN, message)
    finally:
        os.close(log)
        os.close(env_read)
    _hand_over_env(env_write, payload)
    started = procs.read_stat(popen.pid)
    return Launch(popen.pid, started.start_ticks if started else None, popen)


def shim_env() -> dict[str, str]:
    """The agent's own (not the job's) settings the interpreter may need to start."""
    return {key: os.environ[key] for key in ("PATH", "LD_LIBRARY_PATH") if key in os.environ}


def _env_payload(
    env: Mapping[str, str],
    cpus: Sequence[int] = (),
    status: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """The worker's environment, then the shim's settings; an empty entry ends the environment."""
    payload = b"\0".join(os.fsencode(f"{key}={value}") for key, value in env.items())
    settings = [f"status.{key}={value}" for key, value in (status or {}).items()]
    settings += [f"{key}={value}" for key, value in (extra or {}).items()]
    if cpus:
        settings.append(f"cpus={cpu_list(cpus)}")
    if settings:
        payload += b"\0\0" + b"\0".join(os.fsencode(entry) for entry in settings)
    return payload


def _hand_over_env(fd: int, payload: bytes) -> None:
    """Write the worker's environment and the shim's settings to the shim's pipe, as one frame.

    The shim reads it before anything else, and starts nothing unless the
    whole frame came (this agent may die half-way: see :func:`pause_point`).
    """
    framed = frame(payload)
    half = len(framed) // 2
    with contextlib.suppress(OSError), os.fdopen(fd, "wb") as pipe:  # OSError: the shim
        pipe.write(framed[:half])  # died at once, and its exit says why
        pipe.flush()
        pause_point("handover")
        pipe.write(framed[half:])


def _cwd_argument(cwd: str | None) -> str:
    if cwd is None:
        return NO_VALUE
    return f"./{cwd}" if cwd == NO_VALUE else cwd


def prepare_worker(spec: WorkerSpec, status_dir: Path, cgroup_base: Path | None) -> WorkerRuntime:
    """A worker about to launch: its status file and cgroup are named before it exists.

    The supervisor records it like this first, so an agent killed during the
    launch finds the shim by its status file.
    """
    name = f"{spec.job}.{spec.index}.{secrets.token_hex(4)}"
    cgroup = create_worker_cgroup(cgroup_base, name) if cgroup_base is not None else None
    return WorkerRuntime(
        spec=spec,
        pid=0,
        start_ticks=None,
        status_path=str(status_dir / f"{name}.status"),
        cgroup=str(cgroup) if cgroup is not None else "",
    )


def launch_worker(
    job: DesiredJob,
    worker: WorkerRuntime,
    cause: str,
    *,
    base_env: Mapping[str, str],
    log_dir: Path,
    stamp: str,
    warm: IdleShim | None = None,
    boot_id: str = "",
    header_written: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Start a prepared worker as its job's user; return the event to log.

    ``warm``: an idle shim to hand the worker to (see :func:`start_under_shim`);
    ``header_written``: :func:`reserve_log` wrote the log's header already.
    A job whose user cannot be used, or a worker that cannot be started at
    all, leaves the worker ended with exit 126 and ``error`` saying why.
    """
    ws = worker.spec
    try:
        run_as = resolve_run_as(ws.user, ws.group, job=ws.job)
    except RunAsError as exc:
        return _failed(worker, cause, str(exc), _EXIT_CANNOT_RUN)
    Path(worker.status_path).parent.mkdir(parents=True, exist_ok=True)
    fields = status_fields(job, worker, boot_id)
    argv, cwd = _membound(ws.argv, ws.mems, base_env.get("PATH")), ws.cwd
    env, settings = {**base_env, **identity_env(run_as), **ws.env}, {}
    if ws.container is not None:
        try:
            box = container_launch(job, worker, base_env, run_as)
        except EngineMissing as exc:
            return _failed(worker, cause, str(exc), _EXIT_NOT_FOUND)
        # The engine runs as the agent: the job's user and cwd are the container's.
        argv, env, cwd, settings, run_as = box.argv, box.env, None, box.settings, None
        fields.update(box.status)
    result = start_under_shim(
        argv,
        env,
        cwd=cwd,
        log_path=worker_log(log_dir, job, worker),
        header="" if header_written else log_header(ws, cause, stamp),
        status_path=Path(worker.status_path),
        grace=job.grace_seconds,
        cgroup=Path(worker.cgroup) if worker.cgroup else None,
        run_as=run_as,
        cpus=ws.cpus,
        warm=warm,
        status=fields,
        settings=settings,
    )
    if result.pid == 0:
        return _failed(worker, cause, result.error, result.exit_code or _EXIT_CANNOT_RUN)
    worker.pid, worker.start_ticks, worker.popen = result.pid, result.start_ticks, result.popen
    return "worker-started", {
        "job": ws.job,
        "index": ws.index,
        "shim_pid": result.pid,
        "warm": warm is not None and result.popen is warm.popen,
        "cause": cause,
        "gpus": list(ws.gpus),
        "user": run_as.user if run_as is not None else None,
        "cpus": cpu_list(ws.cpus) or None,
        "mems": cpu_list(ws.mems) or None,
        "container": fields.get("container"),
    }


def worker_log(log_dir: Path, job: DesiredJob, worker: WorkerRuntime) -> Path:
    """The worker's log file: ``<job>.log``, or ``<job>.<index>.log`` for one of several."""
    ws = worker.spec
    return log_dir / (f"{ws.job}.log" if len(job.workers) == 1 else f"{ws.job}.{ws.index}.log")


def log_header(ws: WorkerSpec, cause: str, stamp: str) -> str:
    """The line a worker's start writes to its log first."""
    return (
        f"--- allocator {stamp}: starting job {ws.job} worker {ws.index} ({cause}) "
        f"gpus={','.join(map(str, ws.gpus))} device={ws.device} argv={list(ws.argv)} ---"
    )


def reserve_log(path: Path, header: str) -> str:
    """Write the worker's log header before anything starts; "" if done, else why not.

    Only a full disk (or quota) is a why: it passes, so the start waits and
    says so, as for a full state disk, rather than counting as a crash the
    job would be given up on. Any other error is the launch's to report.
    """
    try:
        fd = open_log(path, None)
    except (LogError, OSError):
        return ""
    line = memoryview(header.encode(errors="replace") + b"\n")
    try:
        while line:  # a short write is what the last free block takes: write on to the error
            line = line[os.write(fd, line) :]
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"cannot write the worker's log {path}: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return ""


def _membound(argv: tuple[str, ...], mems: Sequence[int], path: str | None) -> tuple[str, ...]:
    """``argv`` under ``numactl --membind`` when the worker has NUMA nodes and numactl is here."""
    numactl = shutil.which("numactl", path=path) if mems and argv else None
    if numactl is None:
        return argv
    return (numactl, f"--membind={cpu_list(mems)}", "--", *argv)


def _failed(worker: WorkerRuntime, cause: str, error: str, code: int) -> tuple[str, dict[str, Any]]:
    worker.exit_code, worker.group_gone, worker.error = code, True, error
    with contextlib.suppress(OSError):  # the agent's prepared status: no shim will take it on
        os.unlink(worker.status_path)
    fields = {"job": worker.spec.job, "index": worker.spec.index, "cause": cause, "error": error}
    return "worker-start-failed", fields
