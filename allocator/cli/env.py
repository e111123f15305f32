"""``allocator env``: the exact environment a job's worker starts with.

It is computed by the same function the agent uses, so
``eval "$(allocator env job=train)"`` in a hand-run script gives that script
what the agent would give the worker. A per-gpu job's MASTER_ADDR and
MASTER_PORT are the ones the host's agent published for it; for a job the
agent has not started yet, the port is the one the agent's allocation would
choose given the ports its other jobs hold. A share of a job across several
hosts gets its node rank, the job's MASTER_PORT and the MASTER_ADDR its first
host's agent advertises, and follows the other shares' faults, as its agent
would (``host=`` says which share). A job with ``container:`` in the policy
also gets, after the exports, the engine command line its agent would run
(a ``#`` comment, so the output still evaluates; the name's last part is
chosen at each launch). When the agent builds a host worker's command line
(``workers: torchrun``, or ``$(VAR)`` references), it is shown the same way,
as a ``# command:`` comment.
"""

from __future__ import annotations

import argparse
from typing import Any

from allocator.cli.common import add_words_command, note, open_allocator, output_format

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the ``env`` command."""
    add_words_command(
        commands,
        "env",
        run,
        help="print the environment a job's worker gets (shell exports or JSON)",
        usage="allocator env job=NAME [host=H] [worker=N] [-o json]",
        description=__doc__,
    )


def run(args: argparse.Namespace) -> int:
    """Print the worker environment of ``job`` on ``host``."""
    from allocator.cli.args import parse_key_values
    from allocator.cli.output import emit
    from allocator.environments import job_environments
    from allocator.errors import ConflictError, InvalidInput
    from allocator.placement.worker_env import render_exports
    from allocator.records.keys import validate_name

    kv = parse_key_values(args.words, ("job", "host", "worker"))
    if "job" not in kv:
        raise InvalidInput("job= is required (e.g. job=train)")
    job = validate_name(kv["job"], "job")
    worker = _worker_index(kv.get("worker", "0"))
    allocator = open_allocator(args)
    try:
        envs, message, commands = job_environments(allocator, job, kv.get("host"))
    finally:
        allocator.store.close()
    if not envs:
        raise ConflictError(message)
    table = output_format(args) == "table"
    if table and worker >= len(envs):  # checked before any note: one line on a refusal
        raise InvalidInput(f"worker={worker}: job {job!r} has {len(envs)} worker(s)")
    if message:
        note(message)
    if not table:
        emit(envs, output_format(args))
        return 0
    if len(envs) > 1:
        note(f"job {job!r} has {len(envs)} workers; showing worker {worker} (worker=N for others)")
    print(render_exports(envs[worker]), end="")
    if commands[worker]:  # a comment, so `eval` ignores it: what the agent would run
        print(commands[worker])
    return 0


def _worker_index(raw: str) -> int:
    from allocator.errors import InvalidInput

    if not raw.isascii() or not raw.isdigit() or len(raw) > 4:
        raise InvalidInput(f"worker={raw[:20]}: expected a worker index (0, 1, ...)")
    return int(raw)
