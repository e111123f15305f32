"""Waiting, before a holding's command starts, until its GPUs are free of other holdings.

The store may grant GPUs whose previous holder's worker still runs: the
host's agent stops a released job's worker only once it hears of the
release and the worker's stop grace has passed, and an agent whose store
link hangs cannot hear of it at all (it never stops workers because the
store blinked). Only the new holder can wait, so ``run`` and ``lease()``
read what the agent publishes for this host (its worker records, read
after the holding was written) and start nothing while another job's
worker still runs or stops on one of their GPUs
(:func:`allocator.placement.busy_gpus.blockers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from allocator.errors import BadRecord, ConflictError
from allocator.placement.busy_gpus import blockers, describe_blockers
from allocator.records.codec import decode_record
from allocator.records.types import Assignment, WorkerRecord

if TYPE_CHECKING:
    from allocator.control.client import Allocator

__all__ = ["DEFAULT_BOUND", "busy_with", "wait_until_free"]

#: Seconds a holding without ``--wait`` waits for its GPUs' previous workers to stop.
DEFAULT_BOUND = 60.0
_POLL_SECONDS = 0.2


def busy_with(allocator: Allocator, assignment: Assignment) -> dict[str, tuple[int, ...]]:
    """The other jobs whose workers still run on ``assignment``'s GPUs (job -> GPUs)."""
    if assignment.mode == "cpu" or not assignment.gpus:
        return {}
    layout, store = allocator.layout, allocator.store
    held: dict[str, tuple[int, ...]] = {}
    for item in store.list(layout.host_jobs(assignment.host)).items:
        try:
            other = decode_record(item.value, Assignment, item.key)
        except BadRecord:
            continue  # a bad record is reported by its readers, never a reason to wait
        held[other.job] = other.gpus if other.mode == "gpu" else ()
    workers = []
    for item in store.list(layout.host_workers(assignment.host)).items:
        try:
            workers.append(decode_record(item.value, WorkerRecord, item.key))
        except BadRecord:
            continue
    return blockers(assignment.job, assignment.gpus, workers, held)


def wait_until_free(
    allocator: Allocator,
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
        found = busy_with(allocator, assignment)
        if not found:
            return
        what = describe_blockers(found)
        if monotonic() >= deadline:
            raise ConflictError(f"gave up waiting for {what} to stop")
        if what != told:
            tell(f"waiting for {what} to stop")
            told = what
        sleep(_POLL_SECONDS)
