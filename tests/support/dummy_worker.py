"""A stand-in worker for tests and demos: report who it is, then behave as asked.

On start it writes one JSON report (PID, process group, process start time
from ``/proc``, argv, its whole environment) to the file named by ``--out``
or, failing that, by the ``DUMMY_WORKER_OUT`` environment variable. The file
is written atomically (temporary file + rename), so a reader that sees it
sees all of it. It also prints one line to stdout and one to stderr, so
log capture can be checked. Then it does what its options say:

* (default) sleep until a signal ends it;
* ``--ignore-sigterm``: SIGTERM is ignored, only SIGKILL ends it;
* ``--exit-after S --exit-code N``: exit with N after S seconds;
* ``--crash``: exit 1 right away (after the report);
* ``--spawn-child``: first start a child (this same script in child mode)
  that sleeps too, ignores SIGTERM when the parent does, and writes its own
  report to ``<out>.child``; the parent's report names it as ``child_pid``
  and is only written once the child's report exists, so a test that sees
  the parent's report knows both have their signal handling in place;
* ``--stubborn-child``: with ``--spawn-child``, only the child ignores SIGTERM;
* ``--setsid-child``: with ``--spawn-child``, the child leaves the worker's
  session and process group (``os.setsid()``, as torchrun's ranks and
  daemonising helpers do) before it reports; its report gives its ``sid``;
* ``--exit-on-usr2``: SIGUSR2 makes it exit with ``--exit-code`` (a worker
  that ends on cue, e.g. while no agent is running);
* ``--lock PATH``: before anything else take an exclusive ``flock`` on PATH,
  waiting for it if need be, and report ``lock_acquired_at_once``. The
  child inherits the locked descriptor, so the lock is free only once the
  whole worker (child included) is gone: a replacement that started while
  any of its predecessor still ran reports ``false``.

Per-GPU workers run the same command: a worker whose ``LOCAL_RANK`` is set
and not 0 appends ``.rank<N>`` to its report and lock paths, so ranks
neither overwrite each other's report nor wait for each other's lock. So do
the hosts of a job across hosts: ``{host}`` in either path becomes the
worker's ``ALLOCATOR_HOST``.

Run standalone with the interpreter under test (``sys.executable``); it
imports nothing from the project.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

OUT_ENV = "DUMMY_WORKER_OUT"
_CHILD_WAIT_SECONDS = 30.0
_POLL = 0.01


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces and parentheses: split after the last ")".
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[22 - 3])


def _write_atomic(path: Path, data: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _take_lock(path: Path) -> tuple[int, bool]:
    """Lock ``path`` exclusively; return the descriptor and whether it was free at once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd, False
    return fd, True


def _spawn_child(
    out: Path, ignore_sigterm: bool, keep_fds: tuple[int, ...], setsid: bool = False
) -> int:
    child_out = out.with_name(out.name + ".child")
    argv = [sys.executable, os.path.abspath(__file__), "--out", str(child_out)]
    if ignore_sigterm:
        argv.append("--ignore-sigterm")
    if setsid:
        argv.append("--setsid")
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=keep_fds)
    deadline = time.monotonic() + _CHILD_WAIT_SECONDS
    while not child_out.exists():
        if time.monotonic() > deadline or child.poll() is not None:
            sys.exit("dummy worker: the child did not report")
        time.sleep(_POLL)
    return child.pid


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="allocator test worker")
    parser.add_argument("--out", help=f"report file (default: ${OUT_ENV})")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-after", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--setsid-child", action="store_true")
    parser.add_argument("--stubborn-child", action="store_true")
    parser.add_argument("--setsid", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--exit-on-usr2", action="store_true")
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--lock", help="hold an exclusive flock on this file while running")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Report, then sleep, exit or crash as the options say."""
    args = _parse(argv)
    out_name = args.out or os.environ.get(OUT_ENV)
    if not out_name:
        sys.exit(f"dummy worker: no report file (--out or ${OUT_ENV})")
    rank = os.environ.get("LOCAL_RANK", "0")
    suffix = "" if rank == "0" else f".rank{rank}"
    host = os.environ.get("ALLOCATOR_HOST", "")
    out = Path(out_name.replace("{host}", host) + suffix)
    if args.setsid:
        os.setsid()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit_on_usr2:
        code = int(args.exit_code)
        signal.signal(signal.SIGUSR2, lambda _signum, _frame: os._exit(code))
    lock = Path(args.lock.replace("{host}", host) + suffix) if args.lock else None
    lock_fd, at_once = _take_lock(lock) if lock is not None else (None, None)
    keep = (lock_fd,) if lock_fd is not None else ()
    child_pid = (
        _spawn_child(out, args.ignore_sigterm or args.stubborn_child, keep, args.setsid_child)
        if args.spawn_child
        else None
    )
    pid = os.getpid()
    report = {
        "pid": pid,
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "ppid": os.getppid(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "start_ticks": _start_ticks(pid),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "child_pid": child_pid,
        "lock_acquired_at_once": at_once,
    }
    _write_atomic(out, report)
    print(f"dummy worker {pid} started (stdout)", flush=True)
    print(f"dummy worker {pid} started (stderr)", file=sys.stderr, flush=True)
    if args.crash:
        return 1
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        return int(args.exit_code)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
