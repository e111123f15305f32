"""Waiting, before a holding's command starts, until its GPUs are free of other holdings.

The store may grant GPUs whose previous holder's worker still runs: the
host's agent stops a released job's worker only once it hears of the
release and the worker's stop grace has passed, and an agent whose store
link hangs cannot hear of it at all (it never stops workers because the
store blinked). Only the new holder can wait, so ``run`` and ``lease()``
read what the agent publishes for this host (its worker records, read
after the holding was written) and start nothing while another job's
worker still runs or stops on one of their GPUs
(:func:`allocator.placement.busy_gpus.blockers`), nor while a process of
this host that carries an ended holding's identity still runs on one
(:func:`allocator.placement.busy_gpus.leftovers`: the agent stops those
too, once it sees the holding end).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from allocator.errors import BadRecord, ConflictError
from allocator.placement.busy_gpus import blockers, describe_blockers, leftovers
from allocator.records.codec import decode_record
from allocator.records.holding import HOLDING_VARIABLE, holding_identity
from allocator.records.types import Assignment, WorkerRecord
from allocator.util.process_environ import variables_of_processes

if TYPE_CHECKING:
    from allocator.recipes.context import Context

__all__ = ["DEFAULT_BOUND", "busy_with", "carried_holdings", "wait_until_free"]

#: Seconds a holding without ``--wait`` waits for its GPUs' previous workers to stop.
DEFAULT_BOUND = 60.0
_POLL_SECONDS = 0.2


def busy_with(
    allocator: Context, assignment: Assignment, proc: Path = Path("/proc")
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """What still runs on ``assignment``'s GPUs: other jobs' workers, ended holdings' processes.

    Each is job -> GPUs; both empty when the GPUs are free.
    """
    if assignment.mode == "cpu" or not assignment.gpus:
        return {}, {}
    layout, store = allocator.layout, allocator.store
    held: dict[str, tuple[int, ...]] = {}
    current: list[str] = []
    for item in store.list(layout.host_jobs(assignment.host)).items:
        try:
            other = decode_record(item.value, Assignment, item.key)
        except BadRecord:
            continue  # a bad record is reported by its readers, never a reason to wait
        held[other.job] = other.gpus if other.mode == "gpu" else ()
        current.append(holding_identity(other, layout.prefix) or "")
    workers = []
    for item in store.list(layout.host_workers(assignment.host)).items:
        try:
            workers.append(decode_record(item.value, WorkerRecord, item.key))
        except BadRecord:
            continue
    where = (layout.prefix, assignment.host)
    left = leftovers(assignment.gpus, carried_holdings(proc), current, where)
    return blockers(assignment.job, assignment.gpus, workers, held), left


def carried_holdings(proc: Path = Path("/proc")) -> dict[str, tuple[int, ...]]:
    """Holding identity -> GPUs, of the live processes here that carry one (``ALLOCATOR_GPUS``).

    Another user's processes are unreadable without root: those are the
    agent's to stop, and the wait cannot see them.
    """
    found: dict[str, set[int]] = {}
    for _pid, variables in variables_of_processes((HOLDING_VARIABLE, "ALLOCATOR_GPUS"), proc):
        identity = variables.get(HOLDING_VARIABLE)
        if identity:
            raw = variables.get("ALLOCATOR_GPUS", b"")
            indices = {int(g) for g in raw.split(b",") if g.strip().isdigit()}
            found.setdefault(identity.decode(errors="replace"), set()).update(indices)
    return {identity: tuple(sorted(gpus)) for identity, gpus in found.items()}


def wait_until_free(
    allocator: Context,
    assignment: Assignment,
    *,
    bound: float,
    tell: Callable[[str], None],
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once no other job's worker runs on its GPUs; ConflictError after ``bound``."""
    deadline = monotonic() + bound
    told = ""
    while True:
        workers, left = busy_with(allocator, assignment)
        if not workers and not left:
            return
        what = describe_blockers(workers, left)
        if monotonic() >= deadline:
            raise ConflictError(f"gave up waiting for {what} to stop")
        if what != told:
            tell(f"waiting for {what} to stop")
            told = what
        sleep(_POLL_SECONDS)
