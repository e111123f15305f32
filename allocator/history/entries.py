"""The entries of history: what a ``set``, a ``release`` and a ``policy apply`` record.

Pure: each builds the :class:`~allocator.records.types.HistoryEntry` its
change appends (see :mod:`allocator.history.append`).
"""

from __future__ import annotations

from typing import TypedDict

from allocator.records.types import Assignment, HistoryEntry, JobPlace, PolicyRecord

__all__ = ["change_entry", "ended_fields", "policy_entry", "release_entry"]


def change_entry(
    before: Assignment | None, after: Assignment, by: str, at: str, reason: str
) -> HistoryEntry:
    """The entry of a ``set``: ``move`` when the GPUs (or the mode) changed, else ``set``."""
    old_mode, old_gpus = _place(before)
    new_mode, new_gpus = _place(after)
    moved = before is not None and (old_mode, old_gpus) != (new_mode, new_gpus)
    # gpus=1,3 says no more than the entry's GPUs do; count=2 and a fallback do.
    asked = after.requested if after.requested.startswith("count=") else ""
    fell_back = f"placed on the CPU: {after.fallback_reason}" if after.fallback_reason else ""
    detail = "; ".join(part for part in (asked and f"asked for {asked}", fell_back) if part)
    return HistoryEntry(
        seq=0,
        at=at,
        by=by,
        action="move" if moved else "set",
        host=after.host,
        job=after.job,
        from_mode=old_mode,
        from_gpus=old_gpus,
        to_mode=new_mode,
        to_gpus=new_gpus,
        reason=reason,
        detail=detail,
        slots=after.slots if after.mode == "gpu" and after.slots != 1 else None,
        holder=after.holder,
        **ended_fields(before),
    )


def release_entry(
    host: str,
    job: str,
    before: Assignment | None,
    by: str,
    at: str,
    reason: str,
    ended: tuple[int, float] | None = None,
) -> HistoryEntry:
    """The entry of a ``release`` (``before`` ``None``: the record was damaged).

    ``ended``: the exit status and GPU-seconds of the command that held it.
    """
    mode, gpus = _place(before)
    return HistoryEntry(
        seq=0,
        at=at,
        by=by,
        action="release",
        host=host,
        job=job,
        from_mode=mode,
        from_gpus=gpus,
        reason=reason,
        detail="" if before is not None else "its record was damaged",
        exit_status=ended[0] if ended is not None else None,
        gpu_seconds=round(ended[1], 3) if ended is not None else None,
        holder=before.holder if before is not None else "",
        **ended_fields(before),
    )


def policy_entry(
    record: PolicyRecord, old: PolicyRecord | None, reason: str, overridden: int
) -> HistoryEntry:
    """The entry of a policy apply (``overridden``: conflicts it was applied over, --force)."""
    detail = f"from {record.source}" if record.source else ""
    if overridden:
        detail += f"; applied over {overridden} conflicting assignment(s) (--force)"
    return HistoryEntry(
        seq=0,
        at=record.applied_at,
        by=record.applied_by,
        action="policy-apply",
        reason=reason,
        detail=detail.lstrip("; "),
        policy_sha256=record.sha256,
        previous_sha256=old.sha256 if old is not None else None,
    )


def _place(assignment: Assignment | None) -> tuple[JobPlace | None, tuple[int, ...]]:
    if assignment is None:
        return None, ()
    return assignment.mode, tuple(assignment.gpus)


class _Ended(TypedDict):
    started: str | None
    from_slots: int | None
    from_holder: str | None


def ended_fields(before: Assignment | None) -> _Ended:
    """What an entry records of the holding it ends, for the usage rollup (start, slots, holder).

    The holder is the one its start entry named: the assignment's, else its writer's user.
    """
    if before is None or before.mode != "gpu" or not before.gpus:
        return {"started": None, "from_slots": None, "from_holder": None}
    holder = before.holder or before.updated_by.split("@", 1)[0] or before.updated_by
    return {"started": before.updated_at or None, "from_slots": before.slots, "from_holder": holder}
