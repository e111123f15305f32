"""One submitted job's command: started as its proven user, output to a file, reaped.

The command gets a small environment of its own, never the agent's nor the
submitter's (a submission stores no environment values): ``PATH``, the
user's ``HOME``/``USER``/``LOGNAME``, the allocator's variables of its
holding (``CUDA_VISIBLE_DEVICES`` ...), and ``ALLOCATOR_ARRAY_INDEX`` for a
task of an array. It runs in its own session, so it outlives nothing of the
agent's and a stop reaches its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from allocator.records.submission import Submission

__all__ = ["ARRAY_VARIABLE", "BatchProcess", "base_environment", "output_path"]

#: The index of an array's task, in its command's environment.
ARRAY_VARIABLE = "ALLOCATOR_ARRAY_INDEX"
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def output_path(record: Submission, log_dir: Path) -> Path:
    """Where the job's stdout and stderr go: ``output=``, else ``<log dir>/submit/<job>.log``."""
    if not record.output:
        return log_dir / "submit" / f"{record.job}.log"
    path = Path(record.output)
    return path if path.is_absolute() else Path(record.cwd) / path


def base_environment(record: Submission, path: str | None) -> dict[str, str]:
    """The environment every submitted command starts from (its user's ``HOME``, ...)."""
    entry = pwd.getpwnam(record.user)
    env = {
        "PATH": path or _DEFAULT_PATH,
        "HOME": entry.pw_dir,
        "USER": entry.pw_name,
        "LOGNAME": entry.pw_name,
    }
    if record.array_index is not None:
        env[ARRAY_VARIABLE] = str(record.array_index)
    return env


def _as_user(user: str) -> dict[str, Any]:
    """Popen's arguments that start a process as ``user`` (none when the agent is them)."""
    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return {}
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}


def open_output(record: Submission, output: Path) -> int:
    """The output file, opened for appending, private to the job's user.

    An agent running as root never opens a path the user chose with its own
    rights (``output=/etc/...`` would be root's write): the user's process
    creates it, and the agent opens it only if it is still a regular file
    of that user's, never through a symbolic link.
    """
    entry = pwd.getpwnam(record.user)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
    if entry.pw_uid == os.geteuid() or not record.output:  # its own, or the agent's log dir
        output.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(output, flags | os.O_CREAT, 0o600)
        if entry.pw_uid != os.geteuid():
            os.fchown(fd, entry.pw_uid, entry.pw_gid)
        return fd
    subprocess.run(
        ["/bin/sh", "-c", ': >> "$0"', str(output)],
        env={"PATH": _DEFAULT_PATH}, cwd="/", umask=0o077, timeout=10, check=False,
        capture_output=True, **_as_user(record.user),
    )  # fmt: skip
    fd = os.open(output, flags)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_uid != entry.pw_uid:
        os.close(fd)
        raise PermissionError(f"{output} is not a file of {record.user}'s")
    return fd


def _argv(record: Submission) -> tuple[list[str], str]:
    """The command and the directory Popen starts it in.

    As another user, the change of directory is that user's own (a shell's
    ``cd`` after the switch of user), so it reaches no directory they may not.
    """
    if not _as_user(record.user):
        return list(record.argv), record.cwd
    return ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', record.cwd, *record.argv], "/"


class BatchProcess:
    """The running command of one submitted job."""

    def __init__(self, record: Submission, output: Path, env: Mapping[str, str]) -> None:
        self.record = record
        self.output = output
        # Appended: a rerun of the same name keeps the earlier run's lines.
        fd = open_output(record, output)
        self.process: subprocess.Popen[bytes] | None = None
        self.failed_start: int | None = None
        self.stopped_at: float | None = None  # monotonic: when stop_within sent SIGTERM
        argv, cwd = _argv(record)
        try:
            self.process = subprocess.Popen(
                argv,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                start_new_session=True,
                **_as_user(record.user),
            )
        except OSError as exc:
            os.write(fd, f"allocator: cannot start {record.argv[0]!r}: {exc}\n".encode())
            self.failed_start = 127 if isinstance(exc, FileNotFoundError) else 126
        finally:
            os.close(fd)

    def exit_status(self) -> int | None:
        """Its exit status once it ended (128+N for signal N), else ``None``."""
        if self.process is None:
            return self.failed_start
        code = self.process.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def stop_within(self, grace: float, now: float) -> bool:
        """SIGTERM the first time (``True`` then); SIGKILL once ``grace`` seconds have passed."""
        if self.stopped_at is None:
            self.stopped_at = now
            self.stop()
            return True
        if now - self.stopped_at >= grace:
            self.stop(signal.SIGKILL)
        return False

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal its whole process group (no error if it is gone)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
