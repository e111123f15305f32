"""A worker that journals its life: one JSON line when it starts, one when it ends.

``journal_worker.py --journal PATH [--exit-after S]`` appends to PATH (a
file shared by every worker of a run) a ``start`` line (PID, the job and
host from ``ALLOCATOR_JOB``/``ALLOCATOR_HOST``, the GPU indices from
``ALLOCATOR_GPUS``, the wall-clock time) and, when it ends, an ``end``
line: ``how`` is ``exit`` when it ran its ``--exit-after`` seconds and
ended by itself with status 0 (the job finished), ``sigterm`` when it was
stopped. Without ``--exit-after`` it runs until stopped. A SIGKILL leaves
no end line (whoever reads the journal checks whether the PID still lives).

Each line is written with one ``write`` on an ``O_APPEND`` descriptor and
is far shorter than a page, so lines of concurrent workers never mix.
The SIGTERM handler is installed before anything else, and writes the
start line itself if the signal came first: a worker that existed at all
leaves its start in the journal.

Run standalone with the interpreter under test; it imports nothing from
the project.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType

_started = False
_journal = ""


def _append(event: dict[str, object]) -> None:
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    fd = os.open(_journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _start() -> None:
    global _started
    if _started:
        return
    _started = True
    gpus = os.environ.get("ALLOCATOR_GPUS", "")
    _append(
        {
            "event": "start",
            "pid": os.getpid(),
            "job": os.environ.get("ALLOCATOR_JOB", ""),
            "host": os.environ.get("ALLOCATOR_HOST", ""),
            "gpus": [int(g) for g in gpus.split(",") if g],
            "time": time.time(),
        }
    )


def _end(how: str) -> None:
    _start()
    _append({"event": "end", "pid": os.getpid(), "how": how, "time": time.time()})


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    _end("sigterm")
    os._exit(128 + signal.SIGTERM)


def main(argv: list[str]) -> int:
    """Journal the start, run (for ``--exit-after`` seconds or until stopped), journal the end."""
    global _journal
    _journal = argv[argv.index("--journal") + 1]
    exit_after = float(argv[argv.index("--exit-after") + 1]) if "--exit-after" in argv else None
    signal.signal(signal.SIGTERM, _on_sigterm)
    _start()
    if exit_after is None:
        while True:
            signal.pause()
    time.sleep(exit_after)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the end line is the last word
    _end("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
