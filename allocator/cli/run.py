"""``allocator run``: take GPUs on this machine for one command, run it, give them back.

The GPUs are taken by the same transaction as a ``set`` (policy,
reservations, health, the holders of each GPU), bound to a store lease this
process keeps alive: if ``run`` is killed (even with SIGKILL) or the machine
stops, the GPUs are free again within the lease's TTL (``ttl=``, default
15s). The command gets exactly the environment the agent would give a
worker of the job (``allocator env``'s), on top of this shell's; Ctrl-C and
SIGTERM are passed on to its process tree; its exit status is passed
through (death by signal N: 128+N); the GPUs are released only once
nothing of the command's process tree is left (what it left behind gets
SIGTERM, then SIGKILL after ``grace=``, default 10s); Ctrl-Z stops the
whole tree and keeps the hold alive; history records its start and its end,
with the exit status and the GPU-seconds it held. The host's agent counts
these GPUs as held and never starts the command; once the holding ends it
stops whatever of the command is still running (it carries the holding's
identity in its environment).

While the GPUs are busy, ``run`` waits in the host's queue, as ``srun``
does (forever, or ``--wait=DURATION``; Ctrl-C leaves the queue);
``--wait=0`` (or ``--immediate``) is refused at once instead, naming what
is ahead of it. Either way it never passes a request already waiting.
``--preemptible``: it may take GPUs no normal request needs, and when one
does, the tree is stopped (SIGTERM, the grace, SIGKILL) and the GPUs go to
that request ("preempted by JOB" on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from allocator.cli.common import add_words_command, note, open_allocator, queued_notes
from allocator.errors import InvalidInput

__all__ = ["recorded_reason", "register", "split_command"]

USAGE = (
    "allocator run [job=NAME] (count=N | gpus=LIST) [host=H] [slots=K] [ttl=DURATION]"
    " [grace=DURATION] [time=DURATION] [--wait=DURATION | --immediate] [--preemptible]"
    " [--per-gpu]"
    " [--no-record-args]"
    " -- CMD [ARGS...]"
)
#: The key=value words ``run`` takes.
RUN_KEYS = ("job", "count", "gpus", "host", "slots", "ttl", "grace", "time")


def register(commands: Any) -> None:
    """Add the ``run`` command."""
    parser = add_words_command(
        commands,
        "run",
        run,
        help="take GPUs for one command, run it in the foreground, release them when it ends",
        usage=USAGE,
        description=__doc__,
    )
    parser.add_argument(
        "--wait",
        metavar="DURATION",
        default=None,
        help="how long to wait in the queue while the GPUs are busy (default: until they are "
        "free, as srun; DURATION like 30m: then exit 3 naming what it waited for; 0: do not wait)",
    )
    parser.add_argument(
        "--immediate",
        action="store_true",
        help="as --wait=0 (srun's name): refused at once (exit 3) when the GPUs are busy or a "
        "waiting request is ahead, naming it",
    )
    parser.add_argument(
        "--no-record-args",
        action="store_true",
        help="record only the program's name, none of its arguments (status, history and "
        "serve show the rest masked: tokens, passwords, URL passwords)",
    )
    parser.add_argument(
        "--preemptible",
        action="store_true",
        help="use GPUs no normal request waits for; when one needs them, the command's tree "
        "is stopped (SIGTERM, then SIGKILL after grace=) and the GPUs go to it",
    )
    parser.add_argument(
        "--per-gpu",
        action="store_true",
        help="one process per GPU, with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
        "MASTER_PORT (as the agent's workers: per-gpu)",
    )


def split_command(words: Sequence[str]) -> tuple[list[str], list[str]]:
    """``run``'s own words and the command after ``--`` (pure).

    A bare ``--wait`` becomes ``--wait=forever``, so the word after it is
    never taken for its duration.
    """
    words = list(words)
    if "--" not in words:
        return ["--wait=forever" if w == "--wait" else w for w in words], []
    cut = words.index("--")
    own = ["--wait=forever" if w == "--wait" else w for w in words[:cut]]
    return own, words[cut + 1 :]


def run(args: argparse.Namespace) -> int:
    """Take the GPUs, run the command, release them; the command's exit status."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.foreground import DEFAULT_GRACE
    from allocator.recipes.holding import DEFAULT_TTL

    kv = parse_key_values(args.words, RUN_KEYS)
    ttl = _ttl(kv.pop("ttl", None))
    grace = _grace(kv.pop("grace", None), DEFAULT_GRACE)
    asked = kv.pop("time", None)
    _time_limit(asked)  # a malformed time= is refused before anything is taken
    request = _request(kv, asked, preemptible=bool(getattr(args, "preemptible", False)))
    wait = _wait_seconds(args.wait, immediate=args.immediate)
    argv = list(getattr(args, "command_argv", None) or [])
    if not argv:
        raise InvalidInput("give the command to run after `--` (allocator run count=1 -- CMD)")
    allocator = open_allocator(args)
    try:
        reason = recorded_reason(argv, record_args=not args.no_record_args)
        envs, holding = _take(allocator, request, reason, wait, ttl or DEFAULT_TTL, args.per_gpu)
        limit = _limit_of(holding.assignment)
        return _run_held(allocator, holding, argv, envs, (grace, limit), _store_url(args))
    finally:
        allocator.store.close()


def _ttl(raw: str | None) -> float | None:
    """``ttl=DURATION`` in seconds."""
    return None if raw is None else _seconds("ttl", raw, 1, "1s")


def _time_limit(raw: str | None) -> float | None:
    """``time=DURATION``: how long the command may run before its tree is stopped."""
    from allocator.placement.time_limit import resolve_limit

    return resolve_limit(raw, "", None, None)


def _limit_of(assignment: Any) -> float | None:
    """Seconds the command may run: to the assignment's ``ends_at`` (``time=`` or the pool's)."""
    from datetime import UTC, datetime

    from allocator.placement.time_limit import seconds_left

    return seconds_left(assignment.ends_at, datetime.now(UTC))


def _grace(raw: str | None, default: float) -> float:
    """``grace=DURATION``: seconds from SIGTERM to SIGKILL when the command's tree is stopped."""
    return default if raw is None else _seconds("grace", raw, 0, "0s")


def _seconds(word: str, raw: str, least: float, least_text: str) -> float:
    """The duration ``word=raw`` in seconds, from ``least`` to one hour."""
    from allocator.util.durations import parse_duration

    try:
        seconds = parse_duration(raw)
    except ValueError as exc:
        raise InvalidInput(f"{word}=: {exc}") from None
    if not least <= seconds <= 3600:
        raise InvalidInput(f"{word}= must be from {least_text} to 1h")
    return seconds


def _store_url(args: argparse.Namespace) -> str:
    from allocator.store import resolve_store_url

    return resolve_store_url(getattr(args, "store", None))


def _request(kv: dict[str, str], time: str | None, *, preemptible: bool = False) -> Any:
    """The placement request the words ask for (a job name made up if none is given)."""
    from allocator.cli.args import parse_set_args
    from allocator.placement.choose import Request
    from allocator.recipes.holding import default_job_name
    from allocator.util.identity import check_this_host, os_user, this_host

    kv.setdefault("job", default_job_name(os_user(), os.urandom(2)))
    parsed = parse_set_args(f"{key}={value}" for key, value in kv.items())
    if parsed.hosts:
        raise InvalidInput("host= names one host for `run`: its command runs here")
    if parsed.host:
        check_this_host(parsed.host)  # its command runs here: never on another host's GPUs
    return Request(
        job=parsed.job,
        host=parsed.host or this_host(),
        gpus=parsed.gpus,
        count=parsed.count,
        cpu=parsed.cpu,
        slots=parsed.slots,
        time=time,
        preemptible=preemptible,
    )


def _wait_seconds(raw: str | None, *, immediate: bool = False) -> float:
    """Seconds to wait for the GPUs: ``inf`` by default (as srun), 0 for not at all."""
    from allocator.util.durations import parse_duration

    if immediate:
        if raw is not None and raw not in _NO_WAIT:
            raise InvalidInput(f"--immediate does not wait: drop --wait={raw}")
        return 0.0
    if raw is None or raw == "forever":
        return float("inf")
    if raw in _NO_WAIT:
        return 0.0
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise InvalidInput(f"--wait: {exc}") from None


#: ``--wait=`` values that mean: do not wait (``0`` has no unit, and needs none).
_NO_WAIT = ("0", "0s")


def recorded_reason(argv: Sequence[str], *, record_args: bool = True) -> str:
    """What the assignment and history say the command was (pure): secrets never, at most 200.

    Masked as the store's own credentials are (:func:`~allocator.store.credentials.redact_args`);
    with ``record_args`` off, the program's name alone.
    """
    from allocator.store.credentials import redact_args

    if not record_args:
        return f"allocator run: {os.path.basename(argv[0])} (arguments not recorded)"[:200]
    return ("allocator run: " + " ".join(redact_args(argv)))[:200]


def _take(
    allocator: Any, request: Any, reason: str, wait: float | None, ttl: float, per_gpu: bool
) -> tuple[list[dict[str, str]], Any]:
    """Hold the GPUs (waiting if asked) and compute the command's environments."""
    from allocator.environments import worker_envs
    from allocator.recipes.holding import let_go
    from allocator.recipes.waiting import take_waiting
    from allocator.records.holding import HOLDING_VARIABLE, holding_identity

    _check_workers(allocator, request.job, per_gpu)
    holding = take_waiting(
        allocator,
        request,
        wait=wait,
        ttl=ttl,
        reason=reason,
        on_lost=_lost,
        tell=note,
        on_wait=queued_notes(),
        on_preempted=_preempted,
    )
    try:
        envs, remark = worker_envs(allocator, request.job, request.host, per_gpu=per_gpu)
        # Whatever the command starts carries the holding: the agent stops it once it ends.
        identity = holding_identity(holding.assignment, allocator.layout.prefix) or ""
        envs = [{**env, HOLDING_VARIABLE: identity} for env in envs]
    except BaseException:
        let_go(allocator, holding, 1, "allocator run: no environment for the command")
        raise
    if remark:
        note(remark)
    gpus = holding.assignment.gpus
    where = "cpu" if holding.assignment.mode == "cpu" else "gpus " + ",".join(map(str, gpus))
    note(f"{request.job}@{request.host}: {where} (released when the command ends)")
    return envs, holding


def _check_workers(allocator: Any, job: str, per_gpu: bool) -> None:
    """A job the policy declares keeps its own ``workers:``; ``--per-gpu`` must agree."""
    snapshot = allocator.require_policy()
    spec = snapshot.policy.jobs.get(job)
    if spec is not None and (spec.workers == "per-gpu") != per_gpu:
        raise InvalidInput(
            f"job {job!r} is declared with workers: {spec.workers}; "
            + ("drop --per-gpu" if per_gpu else "add --per-gpu")
        )


def _lost(why: str) -> None:
    """The lease is gone: the GPUs may be someone else's now; stop the command."""
    import signal

    note(f"lost the hold on the GPUs ({why}); stopping the command")
    os.kill(os.getpid(), signal.SIGTERM)


def _preempted(by: str) -> None:
    """A normal request needs the GPUs: stop the command's tree (its grace), then let go."""
    import signal

    note(f"preempted by {by}: stopping the command")
    os.kill(os.getpid(), signal.SIGTERM)


def _run_held(
    allocator: Any,
    holding: Any,
    argv: list[str],
    envs: list[dict[str, str]],
    stopping: tuple[float, float | None],
    url: str,
) -> int:
    """Run the command's processes under the holding; release it once nothing of them is left."""
    import signal

    from allocator.cli.foreground import Children
    from allocator.recipes.holding import let_go

    grace, limit = stopping
    children = Children(
        argv,
        envs,
        grace=grace,
        while_stopped=lambda: _keep_while_stopped(holding, url),
        time_limit=limit,
    )
    status = 1
    previous = children.install_forwarding()
    try:
        children.start()
        if holding.preempted_by:  # taken back as it started: the SIGTERM may have found no one
            children.stop()
        status = children.wait()
        return status
    except KeyboardInterrupt:
        children.stop()
        status = 130
        return status
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        children.close()
        why = "time limit" if children.timed_out else f"allocator run ended (exit {status})"
        if holding.preempted_by:
            why = f"preempted by {holding.preempted_by}"
        let_go(allocator, holding, status, why)
        sys.stdout.flush()


def _keep_while_stopped(holding: Any, url: str) -> Any:
    """Before ``run`` stops (Ctrl-Z): a helper keeps the lease alive; the call that ends it.

    The store's URL goes through the helper's environment, never its command
    line (where anyone could read a URL's credentials). A preemptible hold is
    not kept: stopped, it could not give its GPUs back when a normal request
    needs them.
    """
    if holding.assignment.preemptible:
        note("a preemptible hold is not kept while stopped: the GPUs go when its lease expires")
        return lambda: None
    ttl = holding.assignment.run.ttl if holding.assignment.run else 15.0
    try:
        helper = _start_keeper(holding.lease, ttl, url)
    except OSError as exc:
        note(f"cannot keep the hold alive while stopped ({exc.strerror}): it lasts its TTL")
        return lambda: None

    def end() -> None:
        helper.terminate()
        helper.communicate(timeout=10)

    return end


def _start_keeper(lease: int, ttl: float, url: str) -> Any:
    """Start the helper that refreshes ``lease`` while this process is stopped; wait till it has."""
    import subprocess

    helper = subprocess.Popen(
        [sys.executable, "-m", "allocator.recipes.stopped_keeper", str(lease), str(ttl),
         str(os.getpid())],
        env={**os.environ, "ALLOCATOR_STORE": url},
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert helper.stdout is not None
    if helper.stdout.readline() != b"ready\n":  # no store: stopped, the hold runs out its TTL
        note("cannot keep the hold alive while stopped: the GPUs go when the lease expires")
    return helper
