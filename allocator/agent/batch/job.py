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
    """Popen's arguments that start the command as ``user`` (none when the agent is them)."""
    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return {}
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}


class BatchProcess:
    """The running command of one submitted job."""

    def __init__(self, record: Submission, output: Path, env: Mapping[str, str]) -> None:
        self.record = record
        self.output = output
        output.parent.mkdir(parents=True, exist_ok=True)
        # Appended, private: a rerun of the same name keeps the earlier run's lines.
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.process: subprocess.Popen[bytes] | None = None
        self.failed_start: int | None = None
        if os.geteuid() == 0:  # the output is the user's, as the command's own files are
            entry = pwd.getpwnam(record.user)
            os.fchown(fd, entry.pw_uid, entry.pw_gid)
        try:
            self.process = subprocess.Popen(
                list(record.argv),
                cwd=record.cwd,
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

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Signal its whole process group (no error if it is gone)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
