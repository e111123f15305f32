"""The last lines a failed worker wrote, for its worker record: why a job gave up, in ``status``.

``gave-up: worker 0 exited with 1`` says that a job failed, not why; the
why (``GpuUnavailableError: ... CPU-only build``) is at the end of its log.
When the agent gives up on a job it reads the end of the failed worker's log
(:func:`read_end`, the I/O edge) and keeps its last lines
(:func:`last_lines`, pure), bounded for the store: at most
:data:`MAX_LINES` lines and :data:`MAX_BYTES` bytes of UTF-8 in all, control
characters escaped (a log may hold terminal escapes), and store secrets
masked (a worker may print its environment). Only the output of the last
run counts: the agent writes a header line before each start.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from allocator.agent.processes.job_state import JobRuntime
from allocator.store.credentials import redact
from allocator.util.printable import printable

__all__ = [
    "HEADER_PREFIX",
    "MAX_BYTES",
    "MAX_LINES",
    "failed_output",
    "last_lines",
    "log_name",
    "read_end",
    "secret_values",
]

MAX_LINES = 10
MAX_BYTES = 2048
#: How much of the log's end is read: room for long lines cut to the last ones.
READ_BYTES = 16384
#: The line the agent writes into the log before each start (see ``launch``).
HEADER_PREFIX = "--- allocator "
#: Words in a variable's name that make its value a secret to mask (``WANDB_API_KEY``).
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the worker's variables whose names say they are secrets."""
    return [v for k, v in env.items() if v and any(w in k.upper() for w in _SECRET_WORDS)]


def log_name(job: str, index: int, workers: int) -> str:
    """The log of worker ``index`` of a job of ``workers`` workers (named as ``launch`` does)."""
    return f"{job}.log" if workers == 1 else f"{job}.{index}.log"


def read_end(path: Path, size: int = READ_BYTES) -> bytes:
    """The last ``size`` bytes of the log at ``path``; empty when it is not a plain file.

    The log lives where the job's user may write: a symlink put there is not followed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b""
        start = max(0, info.st_size - size)
        data = os.pread(fd, size, start)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return data.partition(b"\n")[2] if start > 0 else data  # a cut first line is partial


def last_lines(
    raw: bytes, secrets: Iterable[str] = (), *, lines: int = MAX_LINES, limit: int = MAX_BYTES
) -> tuple[str, ...]:
    """The last non-blank lines of the last run in ``raw``, escaped, redacted and bounded.

    ``secrets``: more text to mask besides the store's known secrets.
    """
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
    found = text.split("\n")
    headers = [i for i, line in enumerate(found) if line.startswith(HEADER_PREFIX)]
    run = found[headers[-1] + 1 :] if headers else found
    kept = [_clean(line, secrets) for line in run if line.strip()][-lines:]
    while kept and sum(len(line.encode()) for line in kept) > limit:
        if len(kept) == 1:  # one long line: keep its end, where the error is
            kept[0] = kept[0].encode()[-limit:].decode("utf-8", errors="ignore")
        else:
            kept.pop(0)
    return tuple(kept)


def _clean(line: str, secrets: Iterable[str]) -> str:
    return printable(redact(line.rstrip(), secrets))


def failed_output(job: JobRuntime, log_dir: Path) -> tuple[tuple[str, ...], str]:
    """The last lines of ``job``'s first failed worker (else its first), and that log's path."""
    failed = [w for w in job.workers if w.exit_code not in (None, 0)] or job.workers
    if not failed:
        return (), ""
    worker = failed[0]
    path = log_dir / log_name(job.spec.job, worker.spec.index, len(job.workers))
    return last_lines(read_end(path), secret_values(worker.spec.env)), str(path)
