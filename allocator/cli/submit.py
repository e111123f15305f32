"""``allocator submit``: queue a batch job on a host and return at once, printing its name.

The host's agent takes the job's turn in the host's queue (the same
transaction as every waiter's: the turn rule, quotas, reservations), runs
the command as the submitting user with its stdout and stderr to a file
(``output=PATH``; default ``<agent log dir>/submit/<job>.log``), and
releases the GPUs when it ends, with its exit status and GPU-seconds in
history. ``--array=A-B`` queues one task per index, ``NAME-<i>``, each with
``ALLOCATOR_ARRAY_INDEX`` set. ``--preemptible``: it uses GPUs no normal
request waits for, and is stopped (SIGKILL ``grace=`` after SIGTERM,
default 10s) and queued again when one needs them.
The command gets no environment from this shell (the store is readable by
every user): only ``PATH``, the user's ``HOME``, ``USER``, ``LOGNAME`` and
the job's allocator variables. See docs/submit.md.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from allocator.cli.common import add_words_command, open_allocator, output_format
from allocator.errors import InvalidInput

__all__ = ["register"]

USAGE = (
    "allocator submit [job=NAME] (count=N | gpus=LIST) host=H [slots=K] [time=DURATION]"
    " [output=PATH] [--array=A-B] [--preemptible [grace=DURATION]] [-o json] -- CMD [ARGS...]"
)
#: The key=value words ``submit`` takes.
SUBMIT_KEYS = ("job", "count", "gpus", "host", "slots", "time", "grace", "output")
#: The most tasks one array may queue.
MAX_ARRAY = 1000


def register(commands: Any) -> None:
    """Add the ``submit`` command."""
    parser = add_words_command(
        commands,
        "submit",
        run,
        help="queue a batch job on a host; its agent runs it when its turn comes",
        usage=USAGE,
        description=__doc__,
    )
    parser.add_argument(
        "--array", metavar="A-B", default=None, help="one task per index A..B (NAME-<i>)"
    )
    parser.add_argument(
        "--preemptible",
        action="store_true",
        help="use GPUs no normal request waits for; when one needs them, the job is stopped "
        "(SIGTERM, then SIGKILL after its grace) and queued again",
    )


def run(args: argparse.Namespace) -> int:
    """Validate everything, then write every task in one transaction; print the names."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit
    from allocator.recipes.submit.enqueue import BatchJob, submit

    kv = parse_key_values(args.words, SUBMIT_KEYS)
    argv = tuple(getattr(args, "command_argv", None) or ())
    if not argv:
        raise InvalidInput("give the command to run after `--` (allocator submit ... -- CMD)")
    if "host" not in kv:
        raise InvalidInput("give host=H: the host whose agent runs the job")
    time_s = _seconds(kv.pop("time")) if "time" in kv else None
    grace_s = _grace(kv.pop("grace")) if "grace" in kv else None
    output = kv.pop("output", "")
    array = parse_array(args.array)
    allocator = open_allocator(args)
    try:
        request = _request(kv, allocator.holder, array)
        preemptible = bool(getattr(args, "preemptible", False))
        batch = BatchJob(request, argv, os.getcwd(), output, time_s, array, preemptible, grace_s)
        names = submit(allocator, batch)
    finally:
        allocator.store.close()
    emit({"jobs": names, "host": request.host}, output_format(args), "\n".join(names))
    return 0


def parse_array(raw: str | None) -> range | None:
    """``--array=A-B`` as the range of indexes A..B (pure)."""
    if raw is None:
        return None
    first, dash, last = raw.partition("-")
    if not dash or not first.isdigit() or not last.isdigit():
        raise InvalidInput(f"--array={raw}: give A-B, two indexes (0-3)")
    start, end = int(first), int(last)
    if end < start:
        raise InvalidInput(f"--array={raw}: the last index is below the first")
    if end - start + 1 > MAX_ARRAY:
        raise InvalidInput(f"--array={raw}: at most {MAX_ARRAY} tasks")
    return range(start, end + 1)


def _seconds(raw: str) -> float:
    from allocator.util.durations import parse_duration

    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise InvalidInput(f"time={raw}: {exc}") from None
    if seconds <= 0:
        raise InvalidInput(f"time={raw}: give a duration above zero")
    return seconds


def _grace(raw: str) -> float:
    """``grace=DURATION``: from a preempted job's SIGTERM to its SIGKILL, 0s to 1h."""
    from allocator.util.durations import parse_duration

    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise InvalidInput(f"grace={raw}: {exc}") from None
    if not 0 <= seconds <= 3600:
        raise InvalidInput(f"grace={raw}: give 0s to 1h")
    return seconds


def _request(kv: dict[str, str], user: str, array: range | None) -> Any:
    """The placement request (a job name made up if none is given); each task name checked."""
    from allocator.cli.args import parse_set_args
    from allocator.placement.request import Request
    from allocator.recipes.holding import default_job_name
    from allocator.recipes.submit.enqueue import task_names
    from allocator.records.keys import validate_name

    kv.setdefault("job", "sub" + default_job_name(user, os.urandom(2))[3:])
    parsed = parse_set_args(f"{key}={value}" for key, value in kv.items())
    if parsed.hosts:
        raise InvalidInput("host= names one host for `submit`: its agent runs the job")
    if parsed.cpu:
        raise InvalidInput("submit asks for GPUs: give count=N or gpus=LIST")
    for name, _ in task_names(parsed.job, array):
        validate_name(name, "job")
    validate_name(user, "user")
    return Request(
        job=parsed.job,
        host=parsed.host or "",
        gpus=parsed.gpus,
        count=parsed.count,
        slots=parsed.slots,
        self_service=True,
    )
